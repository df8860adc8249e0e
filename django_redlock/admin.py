"""The admin "Locks" page: live lock keys on every node, calls waiting in line, per-node detail, force release.

Nothing is read from the database: each request scans the nodes (SCAN, never
KEYS). Viewing needs ``django_redlock.view_lock``; releasing needs
``django_redlock.release_lock`` and goes through a confirmation page (POST
with CSRF), and every release is written to the admin log.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_redlock.core.listing import NODE_WAIT
from django_redlock.core.records import STATE_WORDS
from django_redlock.models import Lock

PER_PAGE = 100
#: The change list's columns: name (the ``o`` parameter sorts by it), heading, and the listing's order.
COLUMNS = [
    ("resource", gettext_lazy("Resource"), "resource"),
    ("holder", gettext_lazy("Holder"), "holder"),
    ("acquired", gettext_lazy("Acquired"), "acquired_at"),
    ("ttl", gettext_lazy("TTL left"), "ttl"),
    ("nodes", gettext_lazy("Nodes"), "nodes_holding"),
    ("waiting", gettext_lazy("Waiting"), "waiting"),
    ("state", gettext_lazy("State"), "state"),
]
ORDERS = {name: order for name, _label, order in COLUMNS}


def _manager() -> Any:
    from django_redlock.manager import get_lock_manager

    return get_lock_manager()


def _wait(manager: Any) -> float:
    """How long a page waits for a node that does not answer, once: the listing's first call's wait."""
    return max(float(manager.node_timeout), NODE_WAIT)


if TYPE_CHECKING:  # generic in django-stubs only: ModelAdmin takes no [...] at run time
    _ModelAdmin = admin.ModelAdmin[Lock]
else:
    _ModelAdmin = admin.ModelAdmin


@admin.register(Lock)
class LockAdmin(_ModelAdmin):
    """A model-free change list backed by the Redis nodes."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_release_permission(self, request: HttpRequest) -> bool:
        # The admin needs a user model with has_perm(); the stubs' AbstractBaseUser has none.
        return request.user.has_perm("django_redlock.release_lock")  # type: ignore[union-attr]

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        view = self.admin_site.admin_view
        return [
            path("", view(self.changelist_view), name="%s_%s_changelist" % info),
            path("detail/", view(self.detail_view), name="%s_%s_detail" % info),
            path("release/", view(self.release_view), name="%s_%s_release" % info),
        ]

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "title": title,
            "has_release_permission": self.has_release_permission(request),
            **extra,
        }

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        query = request.GET.get("q", "").strip()
        order = request.GET.get("o", "resource")
        field = order.lstrip("-")
        if field not in ORDERS:
            order, field = "resource", "resource"
        started = time.perf_counter()
        error = None
        records: list[Any] = []
        paginator = Paginator(records, PER_PAGE)
        page = paginator.get_page(1)
        nodes: list[dict[str, Any]] = []
        listing = None
        try:
            manager = _manager()
            # The nodes first: one that does not answer is then not waited for again by the listing.
            statuses = manager.node_status(timeout=_wait(manager))
            listing, paginator, page = _read(manager, query or None, order, request.GET.get("p"))
            records = list(listing.records)
            for status in statuses:
                # A node that sits out is in the listing's down (its keys are not trusted), yet up.
                up = status.reachable and (status.name not in listing.down or not status.votes)
                nodes.append({
                    "name": status.name,
                    "up": up,
                    "sits_out": status.sits_out_for if up else 0,
                    "why": status.not_voting_reason or "",
                    "warning": status.warning or "",
                })
        except ImproperlyConfigured as exc:
            error = str(exc)
        rows = [_row(r) for r in records]
        columns = [
            {
                "name": name,
                "label": label,
                "sorted": field == name,
                "descending": order.startswith("-"),
                "toggle": ("" if order.startswith("-") or field != name else "-") + name,
            }
            for name, label, _order in COLUMNS
        ]
        context = self._context(
            request,
            _("Locks"),
            rows=rows,
            page=page,
            paginator=paginator,
            query=query,
            order=order,
            columns=columns,
            nodes=nodes,
            nodes_down=sum(1 for n in nodes if not n["up"]),
            listing=listing,
            error=error,
            elapsed_ms=(time.perf_counter() - started) * 1000,
            **(extra_context or {}),
        )
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_redlock/lock/change_list.html", context)

    def detail_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        resource = request.GET.get("resource", "")
        record = _manager().lock_record(resource) if resource else None
        context = self._context(
            request,
            _("Lock %(resource)s") % {"resource": resource},
            resource=resource,
            record=record,
            row=_row(record) if record else None,
            entries=[_entry(e) for e in record.entries] if record else [],
        )
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_redlock/lock/detail.html", context)

    @staticmethod
    def _selected(request: HttpRequest) -> list[str]:
        source = request.POST if request.method == "POST" else request.GET
        return [r for r in source.getlist("resource") if r]

    def release_view(self, request: HttpRequest) -> HttpResponse:
        if not (self.has_view_permission(request) and self.has_release_permission(request)):
            raise PermissionDenied
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        return _release(self, request)


def _release(admin_obj: LockAdmin, request: HttpRequest) -> HttpResponse:
    """GET (or a POST from the change list) shows the confirmation; POST with confirm=yes releases."""
    resources = admin_obj._selected(request)
    changelist = reverse(f"{admin_obj.admin_site.name}:django_redlock_lock_changelist")
    if not resources:
        messages.warning(request, _("Select at least one lock to release."))
        return HttpResponseRedirect(changelist)
    if request.method == "POST" and request.POST.get("confirm") == "yes":
        manager = _manager()
        content_type = ContentType.objects.get_for_model(Lock, for_concrete_model=False)
        for resource in resources:
            deleted = manager.force_release(resource)
            LogEntry.objects.create(
                user_id=request.user.pk,
                content_type_id=content_type.pk,
                object_id=resource[:255],
                object_repr=resource[:200],
                action_flag=DELETION,
                change_message=f"Force-released on {deleted} of {len(manager.nodes)} nodes.",
            )
        messages.success(
            request,
            _("Released %(count)d lock(s): %(names)s.") % {"count": len(resources), "names": ", ".join(resources)},
        )
        return HttpResponseRedirect(changelist)
    manager = _manager()
    answered = sum(rtt is not None for rtt in manager.ping(_wait(manager)).values())
    records = [manager.lock_record(resource) for resource in resources]
    states = [_("not held on the nodes that answered") if r is None else _(STATE_WORDS[r.state]) for r in records]
    context = admin_obj._context(
        request,
        _("Are you sure?"),
        resources=resources,
        locks=list(zip(resources, states)),
        answered=answered,
        total=len(manager.nodes),
        quorum=manager.quorum,
        # Fewer than a quorum answered, or the silent nodes could complete one: the holder may be working.
        unknown=answered < manager.quorum or any(r is not None and r.state == "unknown" for r in records),
    )
    request.current_app = admin_obj.admin_site.name
    return TemplateResponse(request, "admin/django_redlock/lock/confirm_release.html", context)


def _read(manager: Any, match: str | None, order: str, number: Any) -> tuple[Any, Paginator[Any], Any]:
    """The listing of the asked page (its records in ``order``, the nodes that did not answer), its paginator
    and page.

    One reading: the walk reads of every lock only what the order sorts by,
    then the page's locks in full; a page past the end is the last one.
    """
    pages: list[tuple[Paginator[Any], Any]] = []

    def rows(count: int) -> slice:
        paginator = Paginator(range(count), PER_PAGE)
        page = paginator.get_page(number)
        pages.append((paginator, page))
        return slice((page.number - 1) * PER_PAGE, page.number * PER_PAGE)

    descending = "-" if order.startswith("-") else ""
    listing = manager.lock_listing(match, rows=rows, order=descending + ORDERS[order.lstrip("-")])
    paginator, page = pages[0]
    return listing, paginator, page


def _when(timestamp: float | None) -> datetime | None:
    return datetime.fromtimestamp(timestamp, tz=timezone.utc) if timestamp else None


def _row(record: Any) -> dict[str, Any]:
    holder = record.holder
    return {
        "resource": record.resource,
        "holder": holder,
        "host": holder.host if holder else None,
        "pid": holder.pid if holder else None,
        "label": holder.label if holder else None,
        "acquired": _when(holder.acquired_at) if holder else None,
        "ttl": record.ttl,
        "nodes_holding": record.nodes_holding,
        "total": record.total,
        "waiting": record.waiting,
        "state": record.state,
        "state_words": _(STATE_WORDS[record.state]),
        "down": record.down,
    }


def _entry(entry: Any) -> dict[str, Any]:
    holder = entry.holder
    return {
        "node": entry.node,
        "ttl": entry.ttl,
        "waiting": entry.waiting,
        "holder": holder,
        "token": holder.token if holder else "",
        "acquired": _when(holder.acquired_at) if holder else None,
    }
