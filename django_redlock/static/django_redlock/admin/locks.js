/* The Locks page's auto-refresh: off unless the page's address asks for it (?refresh=5, 10 or 30).
   It loads the page's GET address again (never a POST), pauses while rows are selected, an action is
   chosen, the search or refresh control is being edited, or the tab is hidden, and keeps the keyboard
   focus and scroll position across the reload. */
'use strict';
{
    const KEY = 'django_redlock.refreshFocus';
    const form = document.getElementById('redlock-refresh');
    const seconds = form ? Number(form.dataset.refreshSeconds) : 0;

    // After a refresh: put the focus and the scroll position back where they were.
    const saved = JSON.parse(sessionStorage.getItem(KEY) || 'null');
    sessionStorage.removeItem(KEY);
    if (saved) {
        let target = saved.id ? document.getElementById(saved.id) : null;
        if (!target && saved.href) {
            target = Array.from(document.querySelectorAll('#content-main a')).find(a => a.getAttribute('href') === saved.href);
        }
        if (target) {
            target.focus({preventScroll: true});
        }
        window.scrollTo(0, saved.y || 0);
    }

    function pausedBy() {
        if (document.hidden) {
            return form.dataset.hiddenText;
        }
        const action = document.querySelector('#changelist-form select[name=action]');
        const search = document.getElementById('searchbar');
        const interval = document.getElementById('redlock-refresh-interval');
        const chosen = interval && interval.value !== String(seconds);
        if (document.querySelector('input.action-select:checked') || (action && action.value) ||
                (search && search.value !== search.defaultValue) || chosen) {
            return form.dataset.pausedText;
        }
        return '';
    }

    if (form && seconds > 0) {
        const status = document.getElementById('redlock-refresh-status');
        let due = Date.now() + seconds * 1000;
        const tick = function() {
            const reason = pausedBy();
            const text = reason || form.dataset.runningText;
            if (status.textContent !== text) {
                status.textContent = text;  // said once per change: a role=status region
            }
            if (reason) {
                due = Date.now() + seconds * 1000;  // a full interval again once the pause ends
            } else if (Date.now() >= due) {
                const active = document.activeElement;
                sessionStorage.setItem(KEY, JSON.stringify({
                    id: active && active.id,
                    href: active && active.getAttribute && active.getAttribute('href'),
                    y: window.scrollY,
                }));
                window.location.replace(form.dataset.refreshUrl);
                return;
            }
            window.setTimeout(tick, 1000);
        };
        window.setTimeout(tick, 1000);
    }
}
