"""The admin "Locks" page: live lock keys on every node, calls waiting in line, per-node detail, force release.

Nothing is read from the database: each request scans the nodes (SCAN, never
KEYS). Viewing needs ``django_redlock.view_lock``; releasing needs
``django_redlock.release_lock`` and goes through a confirmation page (POST
with CSRF), and every release is written to the admin log. The change list
filters by state, can refresh itself, and force-releases a selection through
the admin's actions dropdown.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin import options as admin_options
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import urlencode
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from django_redlock.core.listing import NODE_WAIT
from django_redlock.core.records import STATE_WORDS, ForcedRelease
from django_redlock.models import Lock

PER_PAGE = 100
#: The change list's columns: name (the ``o`` parameter sorts by it), heading, and the listing's order.
#: The state comes right after the resource: on a narrow screen it is the column that must show.
COLUMNS = [
    ("resource", gettext_lazy("Resource"), "resource"),
    ("state", gettext_lazy("State"), "state"),
    ("nodes", gettext_lazy("Nodes"), "nodes_holding"),
    ("holder", gettext_lazy("Holder"), "holder"),
    ("acquired", gettext_lazy("Acquired"), "acquired_at"),
    ("ttl", gettext_lazy("TTL left"), "ttl"),
    ("waiting", gettext_lazy("Waiting"), "waiting"),
]
ORDERS = {name: order for name, _label, order in COLUMNS}
#: The states the filter offers (the ``state`` parameter), in the sidebar's order.
STATES = ("held", "minority", "split", "unknown")
#: The auto-refresh intervals offered (the ``refresh`` parameter, seconds); off when absent.
REFRESH_SECONDS = (5, 10, 30)
ACTION = "force_release_selected"
#: Django 6.1's ``ActionLocation.CHANGE_LIST`` (None before 6.1, whose ``get_actions`` takes no location).
CHANGE_LIST: Any = getattr(getattr(admin_options, "ActionLocation", None), "CHANGE_LIST", None)


def _manager() -> Any:
    from django_redlock.manager import get_lock_manager

    return get_lock_manager()


def _wait(manager: Any) -> float:
    """How long a page waits for a node that does not answer, once: the listing's first call's wait."""
    return max(float(manager.node_timeout), NODE_WAIT)


@dataclass(frozen=True)
class _Query:
    """The change list's query string: search, order, state filter, auto-refresh and page.

    Every link on the page keeps the others: sorting and filtering go back to
    the first page, paging and the refresh keep them all.
    """

    q: str = ""
    o: str = "resource"
    state: str = ""
    refresh: int = 0
    p: str = ""

    @classmethod
    def of(cls, request: HttpRequest) -> tuple[_Query, list[str]]:
        """The query asked, and what was wrong with it (an unknown state or refresh is left out)."""
        get = request.GET
        order = get.get("o", "resource")
        if order.lstrip("-") not in ORDERS:
            order = "resource"
        errors = []
        state = get.get("state", "")
        if state and state not in STATES:
            errors.append(
                _("Unknown state %(state)r in the address: expected one of %(states)s.")
                % {"state": state, "states": ", ".join(STATES)}
            )
            state = ""
        refresh = get.get("refresh", "")
        seconds = next((s for s in REFRESH_SECONDS if refresh == str(s)), 0)  # not int(): "²".isdigit() is True
        if refresh and not seconds and refresh != "0":
            errors.append(
                _("Unknown auto-refresh %(refresh)r in the address: expected one of %(seconds)s (seconds).")
                % {"refresh": refresh, "seconds": ", ".join(map(str, REFRESH_SECONDS))}
            )
        return cls(get.get("q", "").strip(), order, state, seconds, get.get("p", "")), errors

    def pairs(self, **changes: Any) -> list[tuple[str, str]]:
        query = replace(self, **changes)
        pairs = [
            ("q", query.q),
            ("o", "" if query.o == "resource" else query.o),
            ("state", query.state),
            ("refresh", str(query.refresh) if query.refresh else ""),
            ("p", str(query.p)),
        ]
        return [(name, value) for name, value in pairs if value]

    def link(self, **changes: Any) -> str:
        return "?" + urlencode(self.pairs(**changes))


if TYPE_CHECKING:  # generic in django-stubs only: ModelAdmin takes no [...] at run time
    _ModelAdmin = admin.ModelAdmin[Lock]
else:
    _ModelAdmin = admin.ModelAdmin


@admin.register(Lock)
class LockAdmin(_ModelAdmin):
    """A model-free change list backed by the Redis nodes."""

    actions = [ACTION]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_release_permission(self, request: HttpRequest) -> bool:
        # The admin needs a user model with has_perm(); the stubs' AbstractBaseUser has none.
        return request.user.has_perm("django_redlock.release_lock")  # type: ignore[union-attr]

    def get_actions(self, request: HttpRequest, action_location: Any = CHANGE_LIST) -> dict[str, Any]:
        # The site-wide actions (delete_selected, ...) work on querysets of table rows: there are none here.
        if action_location is None:
            actions = super().get_actions(request)
        else:
            actions = super().get_actions(request, action_location=action_location)  # type: ignore[call-arg,unused-ignore]
        return {name: action for name, action in actions.items() if name in (self.actions or ())}

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
        if request.method == "POST":
            return self._run_action(request)
        query, errors = _Query.of(request)
        order, field = query.o, query.o.lstrip("-")
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
            listing, paginator, page = _read(manager, query.q or None, order, query.state or None, query.p)
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
        columns = []
        for name, label, _order in COLUMNS:
            toggle = ("" if order.startswith("-") or field != name else "-") + name
            columns.append({
                "name": name,
                "label": label,
                "sorted": field == name,
                "descending": order.startswith("-"),
                "url": query.link(o=toggle, p=""),
            })
        action_form = None
        actions = self.get_actions(request)
        if actions and rows:
            action_form = self.action_form(auto_id=None)
            action_form.fields["action"].choices = self.get_action_choices(request)
        current = query.link()
        context = self._context(
            request,
            _("Locks"),
            rows=rows,
            page=page,
            paginator=paginator,
            query=query.q,
            order=order,
            columns=columns,
            nodes=nodes,
            nodes_down=sum(1 for n in nodes if not n["up"]),
            listing=listing,
            error=error,
            query_errors=errors,
            elapsed_ms=(time.perf_counter() - started) * 1000,
            # The filter sidebar, as ModelAdmin's list_filter draws it.
            state=query.state,
            state_choices=[{"display": _("All"), "selected": not query.state, "url": query.link(state="", p="")}]
            + [
                {"display": _(STATE_WORDS[s]), "selected": query.state == s, "url": query.link(state=s, p="")}
                for s in STATES
            ],
            clear_filters_url=query.link(state="", p=""),
            # Search and refresh forms carry the rest of the query along.
            search_hidden=query.pairs(q="", p=""),
            refresh=query.refresh,
            refresh_choices=REFRESH_SECONDS,
            refresh_hidden=query.pairs(refresh=0),
            refresh_url=request.path + current if current != "?" else request.path,
            previous_url=query.link(p=page.number - 1) if page.has_previous() else "",
            next_url=query.link(p=page.number + 1) if page.has_next() else "",
            # The actions dropdown, as ModelAdmin's.
            action_form=action_form,
            actions_selection_counter=self.actions_selection_counter,
            selection_note=_("0 of %(cnt)s selected") % {"cnt": len(rows)},
            cl={"result_list": rows, "result_count": len(rows)},
            action_checkbox_name=helpers.ACTION_CHECKBOX_NAME,
            **(extra_context or {}),
        )
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_redlock/lock/change_list.html", context)

    def _run_action(self, request: HttpRequest) -> HttpResponse:
        """A POST to the change list: an action of the dropdown (and its confirmation) on the rows selected."""
        actions = self.get_actions(request)
        name = request.POST.get("action", "")
        if name not in actions and (not actions or name == ACTION):
            raise PermissionDenied  # this user may run no action, or not this one
        back = HttpResponseRedirect(request.get_full_path())
        if name not in actions:
            messages.warning(request, _("No action selected."))
            return back
        resources = list(dict.fromkeys(r for r in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME) if r))
        if not resources:
            messages.warning(
                request, _("Items must be selected in order to perform actions on them. No items have been changed.")
            )
            return back
        action = actions[name]  # Django 6.1: an Action; before: a (function, name, description) tuple
        response = (action.func if hasattr(action, "func") else action[0])(self, request, resources)
        return response if isinstance(response, HttpResponse) else back

    @admin.action(description=gettext_lazy("Force-release selected locks"), permissions=["release"])
    def force_release_selected(self, request: HttpRequest, resources: list[str]) -> HttpResponse | None:
        """Confirm first; the confirmation's POST (``post=yes``) releases and reports each lock's outcome."""
        if request.POST.get("post") == "yes":
            _release_all(self, request, resources)
            return None
        hidden = [("action", ACTION), ("post", "yes")] + [(helpers.ACTION_CHECKBOX_NAME, r) for r in resources]
        here = request.get_full_path()
        return _confirmation(self, request, resources, here, hidden, here)

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
        return list(dict.fromkeys(r for r in source.getlist("resource") if r))

    def release_view(self, request: HttpRequest) -> HttpResponse:
        if not (self.has_view_permission(request) and self.has_release_permission(request)):
            raise PermissionDenied
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        return _release(self, request)


def _release(admin_obj: LockAdmin, request: HttpRequest) -> HttpResponse:
    """GET (or a POST without confirm) shows the confirmation; POST with confirm=yes releases."""
    resources = admin_obj._selected(request)
    changelist = reverse(f"{admin_obj.admin_site.name}:django_redlock_lock_changelist")
    if not resources:
        messages.warning(request, _("Select at least one lock to release."))
        return HttpResponseRedirect(changelist)
    if request.method == "POST" and request.POST.get("confirm") == "yes":
        _release_all(admin_obj, request, resources)
        return HttpResponseRedirect(changelist)
    here = reverse(f"{admin_obj.admin_site.name}:django_redlock_lock_release")
    hidden = [("resource", r) for r in resources] + [("confirm", "yes")]
    return _confirmation(admin_obj, request, resources, here, hidden, changelist)


def _confirmation(
    admin_obj: LockAdmin,
    request: HttpRequest,
    resources: list[str],
    form_action: str,
    hidden: list[tuple[str, str]],
    cancel_url: str,
) -> TemplateResponse:
    """The "Are you sure?" page: the selected locks read again, each with its state, warning when unknown."""
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
        form_action=form_action,
        hidden=hidden,
        cancel_url=cancel_url,
    )
    request.current_app = admin_obj.admin_site.name
    return TemplateResponse(request, "admin/django_redlock/lock/confirm_release.html", context)


def _release_all(admin_obj: LockAdmin, request: HttpRequest, resources: list[str]) -> None:
    """Force-release each lock, log each in the admin log, and tell the outcome of each in a message."""
    manager = _manager()
    content_type = ContentType.objects.get_for_model(Lock, for_concrete_model=False)
    released: list[str] = []
    gone: list[str] = []
    for resource in resources:
        try:
            done: ForcedRelease = manager.force_release_detail(resource)
        except ValueError as exc:  # a key written by something else, under a name no lock may have
            text = _("Could not release %(resource)s: %(error)s") % {"resource": resource, "error": exc}
            messages.error(request, text)
            continue
        note = f"Force-released on {done.deleted} of {done.total} nodes."
        if done.unreachable:
            note += f" Not answering: {', '.join(sorted(done.unreachable))}."
        LogEntry.objects.create(
            user_id=request.user.pk,
            content_type_id=content_type.pk,
            object_id=resource[:255],
            object_repr=resource[:200],
            action_flag=DELETION,
            change_message=note,
        )
        if done.unreachable:
            messages.warning(
                request,
                _(
                    "Released %(resource)s on %(deleted)d of %(total)d nodes; %(silent)s did not answer "
                    "(its key there expires with its ttl)."
                )
                % {
                    "resource": resource,
                    "deleted": done.deleted,
                    "total": done.total,
                    "silent": ", ".join(sorted(done.unreachable)),
                },
            )
        elif done.deleted:
            released.append(_("%(resource)s (on %(deleted)d of %(total)d nodes)") % {
                "resource": resource, "deleted": done.deleted, "total": done.total,
            })
        else:
            gone.append(resource)
    if released:
        messages.success(
            request,
            ngettext("Released %(count)d lock: %(names)s.", "Released %(count)d locks: %(names)s.", len(released))
            % {"count": len(released), "names": ", ".join(released)},
        )
    if gone:
        messages.info(
            request,
            ngettext(
                "No node held %(names)s any more: nothing to release.",
                "No node held these any more, nothing to release: %(names)s.",
                len(gone),
            )
            % {"names": ", ".join(gone)},
        )


def _read(
    manager: Any, match: str | None, order: str, state: str | None, number: Any
) -> tuple[Any, Paginator[Any], Any]:
    """The listing of the asked page (its records in ``order``, the nodes that did not answer), its paginator
    and page.

    One reading: the walk reads of every lock only what the order sorts by
    (and its values, to judge its state, when filtered by ``state``), then the
    page's locks in full; a page past the end is the last one.
    """
    pages: list[tuple[Paginator[Any], Any]] = []

    def rows(count: int) -> slice:
        paginator = Paginator(range(count), PER_PAGE)
        page = paginator.get_page(number)
        pages.append((paginator, page))
        return slice((page.number - 1) * PER_PAGE, page.number * PER_PAGE)

    descending = "-" if order.startswith("-") else ""
    listing = manager.lock_listing(match, rows=rows, order=descending + ORDERS[order.lstrip("-")], state=state)
    paginator, page = pages[0]
    return listing, paginator, page


def _when(timestamp: float | None) -> datetime | None:
    return datetime.fromtimestamp(timestamp, tz=timezone.utc) if timestamp else None


def _row(record: Any) -> dict[str, Any]:
    holder = record.holder
    return {
        "resource": record.resource,
        "holder": holder,
        "digest": holder.digest if holder else "",
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
        "digest": holder.digest if holder else "",
        "acquired": _when(holder.acquired_at) if holder else None,
    }
