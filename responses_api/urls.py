"""URLs of the Responses API (filled in by the Responses issue)."""
urlpatterns: list = []
