"""URLs of the Responses and Conversations APIs."""

from django.urls import path

from . import views

urlpatterns = [
    path("v1/responses", views.responses),
    path("v1/responses/<str:response_id>", views.response_detail),
    path("v1/responses/<str:response_id>/cancel", views.response_cancel),
    path("v1/responses/<str:response_id>/input_items", views.response_input_items),
    path("v1/conversations", views.conversations),
    path("v1/conversations/<str:conversation_id>", views.conversation_detail),
    path("v1/conversations/<str:conversation_id>/items", views.conversation_items),
    path("v1/conversations/<str:conversation_id>/items/<str:item_id>", views.conversation_item),
]
