"""Each use of Streamlit's private modules (app/ui/st_private.py, the only module that reads them) still holds
on the Streamlit installed: an upgrade that moves or changes one fails here, naming the use, not somewhere deep in
a page."""

import importlib
import logging
import threading
from pathlib import Path

from pages import APP  # noqa: F401  (puts app/ on the path)
from streamlit.testing.v1 import AppTest
from ui import st_private as private


def test_fragment_rerun_reads_the_run_context_field_it_names():
    from dataclasses import fields

    from streamlit.runtime.scriptrunner import ScriptRunContext, get_script_run_ctx  # noqa: F401

    names = {f.name for f in fields(ScriptRunContext)}
    assert "fragment_ids_this_run" in names, "fragment_rerun: ScriptRunContext.fragment_ids_this_run is gone"
    assert private.fragment_rerun() is False  # no page runs here


def test_fragment_rerun_reads_false_in_a_full_run_and_true_in_a_fragments_own(monkeypatch):
    """A full run reads False (AppTest reruns the whole page on a click, so it cannot show a fragment's own run);
    a run context whose fragment_ids_this_run is set, as Streamlit sets it for a fragment's own run, reads True."""
    from streamlit.runtime import scriptrunner

    class Ctx:
        fragment_ids_this_run = ["a-fragment"]

    monkeypatch.setattr(scriptrunner, "get_script_run_ctx", lambda: Ctx())
    assert private.fragment_rerun() is True
    Ctx.fragment_ids_this_run = []
    assert private.fragment_rerun() is False


def test_a_write_to_a_bound_parameter_is_refused_with_the_ids_unless_bound_skips(tmp_path: Path):
    script = tmp_path / "bound.py"
    script.write_text(
        "import streamlit as st\n"
        "from streamlit.errors import StreamlitAPIException\n"
        "from ui.st_private import unless_bound\n"
        "st.slider('s', 0, 10, 5, key='s', bind='query-params')\n"
        "ids = []\n"
        "for write in (lambda: st.query_params.__setitem__('s', '3'), lambda: st.query_params.__delitem__('s')):\n"
        "    try:\n"
        "        write()\n"
        "    except StreamlitAPIException as e:\n"
        "        ids.append(e.error_id)\n"
        "st.session_state['ids'] = ids\n"
        "with unless_bound():\n"
        "    st.query_params['s'] = '3'\n"
        "st.query_params['free'] = '1'\n"
        "try:\n"
        "    with unless_bound():\n"
        "        raise StreamlitAPIException('another misuse', error_id='something-else')\n"
        "except StreamlitAPIException:\n"
        "    st.session_state['loud'] = True\n")
    at = AppTest.from_file(str(script))
    at.query_params["s"] = "7"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert tuple(at.session_state["ids"]) == private.BOUND_REFUSALS, \
        f"unless_bound: Streamlit's refusals of a bound parameter now carry {at.session_state['ids']}"
    assert at.session_state["loud"]  # any other StreamlitAPIException still raises
    assert at.query_params["free"] == "1"


def test_the_pageless_loggers_are_streamlits_and_quiet_threads_filters_only_those_threads():
    for name in private.PAGELESS_LOGGERS:
        module = importlib.import_module(name)
        assert module._LOGGER.name == name, f"quiet_threads: {name} no longer logs under its module's name"
    private.quiet_threads("test-quiet-")
    logger = logging.getLogger(private.PAGELESS_LOGGERS[0])
    kept = []

    def log():
        record = logger.makeRecord(logger.name, logging.WARNING, __file__, 0, "missing ScriptRunContext", (), None)
        kept.append(all(f.filter(record) for f in logger.filters))

    for thread_name in ("test-quiet-1", "a-page"):
        t = threading.Thread(target=log, name=thread_name)
        t.start()
        t.join()
    assert kept == [False, True]
