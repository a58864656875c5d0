"""Websocket URLs (metrale_site/asgi.py routes the `websocket` scope here): the live dashboard."""
from django.urls import path

from .operations.dashboard import DashboardConsumer

websocket_urlpatterns = [path("ws/admin/dashboard/", DashboardConsumer.as_asgi())]
