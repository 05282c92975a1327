from optimus_preflight.config.compose import compose

__all__ = ["compose"]
