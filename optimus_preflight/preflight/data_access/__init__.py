"""How checks reach the user's data: every call into data code under the preflight's
timeout (``fetch``, ``guard``), the stacks of hung workers (``worker_stacks``), and views
of a batch's samples (``samples``). Imports the framework only, never a check."""
