"""Django REST framework views for the JSON-answer tests (needs djangorestframework)."""

from django.urls import path
from rest_framework.decorators import api_view
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redlock import lock_manager, redlock


class InvoiceView(APIView):
    @redlock("invoice-{pk}", ttl=5)
    def post(self, request, pk):
        return Response({"paid": pk})


@api_view(["POST"])
@redlock("refund-{pk}", ttl=5)
def refund(request, pk):
    return Response({"refunded": pk})


@api_view(["POST"])
def by_hand(request, pk):
    with lock_manager.lock(f"credit-{pk}", blocking=False):
        return Response({"credited": pk})


urlpatterns = [
    path("api/invoice/<int:pk>/", InvoiceView.as_view()),
    path("api/refund/<int:pk>/", refund),
    path("api/credit/<int:pk>/", by_hand),
]
