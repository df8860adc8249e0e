from django.contrib import admin
from django.urls import path

from shop import views

urlpatterns = [
    path("", views.index, name="index"),
    path("slow/<int:pk>/", views.slow_report, name="slow"),
    path("async/<int:pk>/", views.async_report, name="async"),
    path("cbv/<int:pk>/", views.InvoiceView.as_view(), name="cbv"),
    path("fencing/", views.fencing, name="fencing"),
    path("admin/", admin.site.urls),
]
