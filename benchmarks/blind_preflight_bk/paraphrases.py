"""Two hand-written paraphrases of a correct diagnosis per broken case, in generic wording (what a checker that found
the cause might say); ``check_patterns.py`` requires each case's cause_pattern to match both."""

PARAPHRASES = {
    "poisson_forcing_broadcast": [
        "The PDE residual has shape (N, N): the (N, 1) second derivative minus a flat (N,) source term broadcasts "
        "into an outer difference.",
        "Your forcing vector is 1-D, so subtracting it from u_xx broadcasts and every point is paired with every "
        "other point's right-hand side; unsqueeze it to (N, 1).",
    ],
    "fno_high_modes_kept": [
        "The spectral convolution keeps the highest-frequency modes of the rfft ([..., -modes:]) rather than the lowest.",
        "Fourier coefficients are truncated from the wrong end: the layer multiplies the high-frequency modes, which "
        "the smooth inputs hardly contain; slice [..., :modes].",
    ],
    "grid_meshgrid_xy": [
        "The coordinates come from torch.meshgrid with indexing='xy' while the field was tabulated in 'ij' order, so "
        "inputs and values are transposed.",
        "Each flattened grid coordinate is matched with the transposed field value; build the grid with "
        "indexing='ij'.",
    ],
    "trajectory_view_not_transpose": [
        "The time-major (T, N, 2) trajectory array is reshaped to (N, T, 2) instead of transposed, so the training "
        "pairs come from different trajectories.",
        "Using .view/.reshape rather than .transpose(0, 1) on the simulated trajectories scrambles the time and "
        "trajectory axes; use permute or transpose.",
    ],
    "heat_mixed_derivative": [
        "u_xx is computed as autograd.grad of the whole gradient [u_x, u_t], which adds the mixed derivative u_tx to "
        "the second derivative.",
        "The second derivative sums over both columns of the first gradient; differentiate only the u_x column "
        "(du[:, 0:1]) to get u_xx.",
    ],
    "poisson_source_sign": [
        "The source term has the wrong sign for the -u'' = f convention, so the network converges to the negated "
        "solution.",
        "The forcing in the residual is flipped: with the minus Laplacian the right-hand side must be +pi^2 sin(pi x).",
    ],
    "subsampled_dt_targets": [
        "The finite-difference derivative targets divide by the original dt although the trajectories were "
        "subsampled with stride 2; use 2 * dt.",
        "After keeping every second frame, the time step between samples doubled but the derivative targets were "
        "not rescaled, so they are twice too large.",
    ],
    "hnn_reversed_difference": [
        "The derivative targets are computed as z[t] - z[t+1], the reversed difference, so the model learns the "
        "backward-in-time flow.",
        "Your finite-difference targets have the wrong sign (previous minus next), which makes the Hamiltonian "
        "network fit a time-reversed flow.",
    ],
    "euler_state_not_increment": [
        "The vector field is regressed onto the next state instead of the increment (z[t+1] - z[t]) / dt that the "
        "Euler step expects.",
        "Targets should be the derivative or difference, not the next state itself: the Euler update adds dt times "
        "the network output.",
    ],
    "heat_initial_at_final_time": [
        "The initial-condition points are placed at t = 1, the end of the time window, instead of t = 0.",
        "The IC term imposes sin(pi x) at the final time rather than at the start; set the initial points' time to "
        "t = 0.",
    ],
    "surrogate_head_swapped": [
        "The output head was replaced after the optimizer was built, so the optimizer still holds the old head's "
        "tensors and the new one never trains.",
        "A new nn.Linear head was assigned to the model after the optimizer was created; construct the optimizer "
        "after swapping the last layer.",
    ],
    "poisson_residual_no_graph": [
        "The second derivative is taken with create_graph=False, so the PDE residual has no graph to the weights.",
        "The physics term is detached: u_xx comes out of autograd.grad without a graph, so only the boundary loss "
        "back-propagates.",
    ],
    "heat_alpha_unregistered": [
        "The diffusivity alpha is a plain tensor attribute, not an nn.Parameter, so it is not in model.parameters() "
        "and is never updated.",
        "The PDE coefficient you meant to learn is not registered with the module; wrap it in nn.Parameter so the "
        "optimizer sees it.",
    ],
    "fno_weights_plain_tensor": [
        "The spectral layer's complex weights are plain tensors rather than nn.Parameter, so they are not in "
        "model.parameters() and never trained.",
        "The Fourier weights were stored as plain tensors with requires_grad=True; they are not registered and stay "
        "random.",
    ],
    "deeponet_trunk_left_out": [
        "The optimizer only holds the branch network: the trunk net is never updated.",
        "The trunk network's parameters are missing from the Adam optimizer, so the coordinate basis stays at "
        "initialisation.",
    ],
    "poisson_relu_pinn": [
        "ReLU activations have zero second derivative almost everywhere, so u_xx is identically zero; use tanh.",
        "The network is piecewise linear (ReLU), so the PDE residual's second derivative vanishes and cannot be "
        "fitted.",
    ],
    "pinn_grad_normalised_coords": [
        "Derivatives are taken with respect to the normalised coordinate instead of the physical x, missing the "
        "chain-rule factor.",
        "autograd.grad differentiates with respect to the scaled input, so u_xx is off by the square of the scale "
        "factor; differentiate w.r.t. the physical coordinate.",
    ],
    "periodic_cnn_zero_padding": [
        "The convolutions pad with zeros on a periodic domain; use padding_mode='circular'.",
        "On periodic data, zero padding puts a fake wall at the boundaries; wrap the field with circular padding.",
    ],
    "fourier_features_cos_only": [
        "The Fourier-feature embedding uses cosine twice instead of cosine and sine, so it is an even function of x.",
        "Your positional encoding concatenates cos with cos instead of sin, so the features are even in x and odd "
        "parts of the target cannot be represented.",
    ],
    "ode_residual_mean_then_square": [
        "The residual loss squares the batch mean, residual.mean() ** 2, so positive and negative residuals cancel.",
        "Averaging before squaring lets signed residuals cancel; use (residual ** 2).mean().",
    ],
    "poisson_collocation_half_domain": [
        "The collocation points are sampled in [0, 1) but the domain is [-1, 1], so half the domain has no residual "
        "points.",
        "torch.rand samples only [0, 1): the interior points cover only the right half of the domain; rescale them "
        "to [-1, 1].",
    ],
    "pairs_collate_sorted_inputs": [
        "The collate_fn sorts the inputs but not the targets, so inputs and targets in a batch no longer correspond.",
        "Reordering the states in collate without applying the same permutation to the labels misaligns each batch.",
    ],
    "pairs_across_trajectories": [
        "Training pairs are built across trajectory boundaries: the last state of one trajectory is paired with the "
        "first of the next.",
        "The trajectories were flattened into one sequence before making windows, so some windows straddle two "
        "unrelated episodes.",
    ],
    "heat_boundary_points_interior": [
        "The boundary points are sampled anywhere in [-1, 1] instead of at x = -1 and x = 1, so the Dirichlet "
        "condition is imposed in the interior.",
        "Your BC points are not on the boundary: round them to the endpoints, otherwise u = 0 is enforced at random "
        "interior locations.",
    ],
    "sampler_low_energy_quarter": [
        "The sampler only draws from the first quarter of the dataset, which holds the lowest-energy trajectories.",
        "The subset indices cover only a fraction of the data (len // 4); the model never sees the high-energy "
        "part of phase space.",
    ],
}
