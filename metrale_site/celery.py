"""The Celery app: in-process (eager) tasks unless CELERY_BROKER_URL is set."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "metrale_site.settings")

app = Celery("metrale")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
