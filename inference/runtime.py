"""The process's engine: created from settings on server start or first use (filled in by the skeleton)."""


def start_loading():
    """Start loading the model in a background thread."""
