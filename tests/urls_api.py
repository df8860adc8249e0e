"""Django REST framework views for the JSON-answer tests (needs djangorestframework)."""

from django.urls import path
from rest_framework.decorators import api_view
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redlock import lock_manager, redlock
from django_redlock.decorators import RedlockMixin
from tests.conftest import eventually


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


class LedgerView(RedlockMixin, APIView):
    """RedlockMixin around REST framework's dispatch."""

    redlock_key = "ledger-{pk}"
    redlock_ttl = 5

    def get(self, request, pk):
        return Response({"ledger": pk})


class PrivateLedgerView(LedgerView):
    permission_classes = [IsAuthenticated]


class OutlivingLedgerView(LedgerView):
    """Runs on past its 0.3 s lock: the lock is lost before it answers."""

    redlock_ttl = 0.3

    def get(self, request, pk):
        eventually(lambda: not lock_manager.is_locked(f"ledger-{pk}"), 30)
        return Response({"ledger": pk})


urlpatterns = [
    path("api/invoice/<int:pk>/", InvoiceView.as_view()),
    path("api/refund/<int:pk>/", refund),
    path("api/credit/<int:pk>/", by_hand),
    path("api/ledger/<int:pk>/", LedgerView.as_view()),
    path("api/private-ledger/<int:pk>/", PrivateLedgerView.as_view()),
    path("api/outliving-ledger/<int:pk>/", OutlivingLedgerView.as_view()),
]
