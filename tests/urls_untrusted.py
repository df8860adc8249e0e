"""Views whose lock keys are built from what the client sends: URL kwargs and a JSON body."""

import json

from django.http import HttpResponse
from django.urls import path
from django.views import View
from rest_framework.decorators import api_view
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redlock import redlock
from django_redlock.decorators import RedlockMixin


@redlock("doc-{name}", ttl=5)
def doc(request, name):
    return HttpResponse("ok")


@redlock("doc-{name}", ttl=5)
async def doc_async(request, name):
    return HttpResponse("ok")


class DocView(RedlockMixin, View):
    redlock_key = "doc-{name}"
    redlock_ttl = 5

    def get(self, request, name):
        return HttpResponse("ok")


class DocAsyncView(RedlockMixin, View):
    redlock_key = "doc-{name}"
    redlock_ttl = 5

    async def get(self, request, name):
        return HttpResponse("ok")


@redlock(lambda request: "order-" + json.loads(request.body)["order"], ttl=5)
def order(request):
    return HttpResponse("ok")


@redlock(lambda request: [f"item-{i}" for i in json.loads(request.body)["items"]], ttl=5)
def items(request):
    return HttpResponse("ok")


class DocApiView(APIView):
    @redlock("doc-{name}", ttl=5)
    def get(self, request, name):
        return Response({"doc": name})


@api_view(["GET"])
@redlock("doc-{name}", ttl=5)
def doc_api(request, name):
    return Response({"doc": name})


class DocMixinApiView(RedlockMixin, APIView):
    redlock_key = "doc-{name}"
    redlock_ttl = 5

    def get(self, request, name):
        return Response({"doc": name})


urlpatterns = [
    path("doc/<str:name>/", doc),
    path("doc-async/<str:name>/", doc_async),
    path("doc-mixin/<str:name>/", DocView.as_view()),
    path("doc-mixin-async/<str:name>/", DocAsyncView.as_view()),
    path("order/", order),
    path("items/", items),
    path("api/doc/<str:name>/", DocApiView.as_view()),
    path("api/doc-fn/<str:name>/", doc_api),
    path("api/doc-mixin/<str:name>/", DocMixinApiView.as_view()),
]
