from django.contrib import admin

from shop.models import Invoice


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    list_display = ["number", "status", "fencing_token", "note"]
    readonly_fields = ["fencing_token"]
