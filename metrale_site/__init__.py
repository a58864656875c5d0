"""The Django project that hosts Metrale: settings, ASGI router, URLs and the Celery app."""
from .celery import app as celery_app

# The package's version, the only place it is written (pyproject.toml reads it: [tool.setuptools.dynamic]).
__version__ = "0.1.0"

__all__ = ("__version__", "celery_app")
