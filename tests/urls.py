from django.contrib import admin
from django.urls import path

from tests import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("pay/<int:pk>/", views.pay),
    path("pay-async/<int:pk>/", views.pay_async),
    path("export/", views.export),
    path("stream/<int:pk>/", views.stream),
    path("report/<int:pk>/", views.ReportView.as_view()),
    path("report-mixin/<int:pk>/", views.ReportMixinView.as_view()),
    path("custom/<int:pk>/", views.custom),
    path("account/", views.account),
]
