"""The admin's live engine dashboard page (staff only): the template and script that watch the websocket
`/ws/admin/dashboard/` (inference/operations/dashboard.py; message schema in ARCHITECTURE.md)."""
from __future__ import annotations

from django.contrib import admin
from django.template.response import TemplateResponse

from inference.operations import runtime


def dashboard(request):
    """GET /admin/dashboard/: the page inside the admin's layout; its data arrives over the websocket
    (static/console/dashboard.js). The admin's own login guards it (admin.site.admin_view)."""
    context = {**admin.site.each_context(request), "title": "Live engine dashboard",
               "model": runtime.served_model_name(), "websocket_path": "/ws/admin/dashboard/"}
    return TemplateResponse(request, "console/dashboard.html", context)


dashboard_view = admin.site.admin_view(dashboard)
