"""URLs of the console pages."""
from django.urls import path

from . import views
from .dashboard import dashboard_view

urlpatterns = [
    # Before the admin's own URLs (metrale_site/urls.py), so its catch-all does not take it.
    path("admin/dashboard/", dashboard_view, name="admin-dashboard"),
    path("", views.front_door, name="front-door"),
    path("playground", views.playground, name="playground"),
]
