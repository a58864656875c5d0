"""URLs of the Files and Batch APIs."""
from django.urls import path

from inference.http.api import by_method

from . import views

urlpatterns = [
    path("v1/files", by_method(GET=views.list_files, POST=views.create_file)),
    path("v1/files/<str:file_id>", by_method(GET=views.retrieve_file, DELETE=views.delete_file)),
    path("v1/files/<str:file_id>/content", by_method(GET=views.file_content)),
    path("v1/batches", by_method(GET=views.list_batches, POST=views.create_batch)),
    path("v1/batches/<str:batch_id>", by_method(GET=views.retrieve_batch)),
    path("v1/batches/<str:batch_id>/cancel", by_method(POST=views.cancel_batch)),
]
