"""The one module that reads Streamlit's private (undocumented) modules; each use says why no public API does, and
tests/test_app_private.py fails loudly, naming the use, when a Streamlit upgrade moves or changes it.

    fragment_rerun      whether this script run reruns fragments only: a fragment that redraws shared slots must
                        know it (Explore's columns); Streamlit 1.67 has no public way to ask.
    unless_bound        a write to st.query_params skipped when Streamlit refuses it because the parameter is bound
                        to a widget (bind="query-params"): only that refusal, told by its error_id, not any other
                        misuse, which stays loud.
    quiet_threads       Streamlit's loggers that warn on every cached call made from a thread with no page
                        ("missing ScriptRunContext", "No runtime found"): the warm-up's threads have none on purpose.
"""

from __future__ import annotations

import contextlib
import logging

# streamlit.errors is importable but not in Streamlit's API reference; its StreamlitAPIException carries the
# error_id that tells a bound parameter's refusal from any other.
from streamlit.errors import StreamlitAPIException

# The error ids Streamlit 1.67 raises for a write or a delete of a bound query parameter
# (streamlit/runtime/state/query_params.py).
BOUND_REFUSALS = ("query-param-bound-cannot-set", "query-param-bound-cannot-delete")

# The loggers that warn from a thread with no page (streamlit/runtime/scriptrunner_utils/script_run_context.py,
# streamlit/runtime/caching/cache_data_api.py).
PAGELESS_LOGGERS = ("streamlit.runtime.scriptrunner_utils.script_run_context",
                    "streamlit.runtime.caching.cache_data_api")


def fragment_rerun() -> bool:
    """Whether this script run reruns fragments only (not the whole page)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return bool(ctx is not None and ctx.fragment_ids_this_run)


@contextlib.contextmanager
def unless_bound():
    """Run a write to st.query_params, skipped when the parameter is bound to a widget (that widget owns it)."""
    try:
        yield
    except StreamlitAPIException as e:
        if getattr(e, "error_id", None) not in BOUND_REFUSALS:
            raise


def quiet_threads(thread_prefix: str) -> None:
    """Silence Streamlit's warnings about a missing page for the threads whose names start with `thread_prefix`."""

    class _NoPageHere(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not record.threadName.startswith(thread_prefix)

    for name in PAGELESS_LOGGERS:
        logging.getLogger(name).addFilter(_NoPageHere())
