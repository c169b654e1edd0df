"""What Explore hands out is what it shows: after a knob move of each kind (a registry estimator's, a framework
preset's, the custom composition's part), and from a link that sets a knob, the downloaded prime-rl TOML, verl
YAML and the framework's own snippet carry the knob's value the page shows (its popover's code is the download's
text), and the Metrics CSV holds the page's table values. The downloads are read as a browser would get them:
after the run (a deferred one is called then, outside the script), from the bytes the page registered."""

import math

import pytest
import tomllib
import yaml

from seqis import PRESETS, run_many
from seqis.samplers.scenarios import make_batch

pytest.importorskip("streamlit")
from pages import explore, open_code  # noqa: E402
from streamlit.runtime.media_file_manager import MediaFileManager  # noqa: E402
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402


@pytest.fixture
def files(monkeypatch):
    """Every file a download button registers, by its id: bytes (data given at once) or a callable (deferred)."""
    got: dict[str, object] = {}
    load, defer = MemoryMediaFileStorage.load_and_get_id, MediaFileManager.add_deferred

    def loaded(self, path_or_data, *a, **k):
        file_id = load(self, path_or_data, *a, **k)
        got[file_id] = path_or_data
        return file_id

    def deferred(self, data_callable, *a, **k):
        file_id = defer(self, data_callable, *a, **k)
        got[file_id] = data_callable
        return file_id

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", loaded)
    monkeypatch.setattr(MediaFileManager, "add_deferred", deferred)
    return got


def download(at: AppTest, files: dict, label_start: str) -> str:
    """The text a click on the download button whose label starts so would save."""
    button = next(b for b in at.get("download_button") if b.proto.label.startswith(label_start))
    file_id = button.proto.deferred_file_id or button.proto.url.rsplit("/", 1)[-1].split(".")[0]
    data = files[file_id]
    data = data() if callable(data) else data
    return data.decode() if isinstance(data, bytes) else data


def export_to(at: AppTest, name: str, trainer: str) -> None:
    """Export `name` to `trainer`, the popover's code open (a new pick is a new popover, closed)."""
    at.selectbox(key="ex.export").select(name).run()
    at.selectbox(key="ex.export.fw").select(trainer).run()
    open_code(at)


def shown_code(at: AppTest, name: str) -> str:
    """The export popover's code on the page (the download's text, and a trailing note line at most)."""
    (code,) = [c.value for c in at.code if c.value.startswith(f"# seqis {name}")]
    return code


def shows(at: AppTest, name: str, text: str) -> bool:
    """The page's popover shows this download's text (st.code drops the last newline)."""
    return shown_code(at, name).startswith(text.rstrip("\n"))


def csv_metric(text: str, estimator: str, name: str) -> float:
    import io

    import pandas as pd

    df = pd.read_csv(io.StringIO(text))
    row = df[(df.table == "metric") & (df.estimator == estimator) & (df.name == name)]
    return float(row.value.iloc[0])


def page_metric(at: AppTest, estimator: str, name: str) -> str:
    return str(at.table[0].value.loc[name, estimator])


def same_on_page(cell: str, value: float) -> bool:
    """The page's cell prints the CSV's whole value (to its four significant digits)."""
    return math.isclose(float(cell.replace(",", "")), value, rel_tol=5e-4, abs_tol=1e-12)


def small_batch(**kw):
    return make_batch("gaussian", n_rollouts=64, max_len=256, seed=0, **kw)


def check_registry_estimator(at: AppTest, files: dict) -> None:
    """seq_clip 6 on the page: the TOML, the YAML and the CSV say 6 and its is_clipped."""
    from seqis import ESTIMATORS

    want = run_many([("seq_tis", ESTIMATORS["seq_tis"].config(seq_clip=6.0))], small_batch())["seq_tis"].scalars()
    cell = page_metric(at, "seq_tis", "is_clipped")
    csv = download(at, files, "Metrics CSV")
    got = csv_metric(csv, "seq_tis", "is_clipped")
    assert got == pytest.approx(want["is_clipped"]) and same_on_page(cell, got)
    # an effective-batch row: the library's name beside the page's words, the value the page shows
    import io

    import pandas as pd

    df = pd.read_csv(io.StringIO(csv))
    row = df[(df.table == "effective") & (df.estimator == "seq_tis") & (df.name == "clipped_frac")].iloc[0]
    assert row.label == "rollouts clipped, share"
    assert same_on_page(str(at.table[1].value.loc["rollouts clipped, share", "seq_tis"]), row.value)
    export_to(at, "seq_tis", "prime-rl")
    toml = download(at, files, "Download seq_tis.prime-rl.toml")
    assert tomllib.loads(toml)["loss"]["sequence_clip_high"] == 6.0
    assert shows(at, "seq_tis", toml)
    export_to(at, "seq_tis", "verl")
    text = download(at, files, "Download seq_tis")
    assert yaml.safe_load(text)["algorithm"]["rollout_correction"]["rollout_is_threshold"] == 6.0
    assert shows(at, "seq_tis", text)


def test_a_registry_estimators_knob_reaches_every_download(files):
    at = explore(**{"ex.est": "seq_tis,mis_po"})
    at.select_slider(key="ex.seq_tis.seq_clip").set_value(6.0).run()
    assert at.select_slider(key="ex.seq_tis.seq_clip").value == 6.0
    check_registry_estimator(at, files)


def test_a_knob_set_by_a_link_reaches_every_download(files):
    at = explore(**{"ex.est": "seq_tis,mis_po", "ex.seq_tis.seq_clip": "6.0"})
    check_registry_estimator(at, files)


def moved(files: dict, key: str, knob: str, value: float) -> AppTest:
    """Explore with the framework preset `key` beside seq_tis, its knob moved; its Metrics CSV checked."""
    framework = PRESETS[key].framework
    at = explore(**{"ex.est": "seq_tis", "ex.fw": framework, f"ex.fw.{framework}": key, "ex.sc.gaussian.s": "0.3"})
    at.select_slider(key=f"ex.{key}.{knob}").set_value(value).run()
    want = run_many([(key, PRESETS[key].config.replace(**{knob: value}))], small_batch(s=0.3))[key].scalars()
    got = csv_metric(download(at, files, "Metrics CSV"), key, "is_masked")
    assert got == pytest.approx(want["is_masked"]) and same_on_page(page_metric(at, key, "is_masked"), got)
    return at


def test_a_presets_knob_reaches_every_download(files):
    key = "trl/sequence_mask"
    at = moved(files, key, "vllm_importance_sampling_clip_max", 1.5)
    export_to(at, key, "trl")  # the preset's own framework
    text = download(at, files, "Download trl_sequence_mask")
    assert "vllm_importance_sampling_clip_max=1.5," in text and shows(at, key, text)
    export_to(at, key, "verl")
    text = download(at, files, "Download trl_sequence_mask")
    assert shows(at, key, text) and "1.5" in text


def test_a_custom_compositions_part_reaches_every_download(files):
    key = "custom/composition"
    at = moved(files, key, "weight_clip", 5.0)
    export_to(at, key, "verl")
    text = download(at, files, "Download custom")
    assert yaml.safe_load(text)["algorithm"]["rollout_correction"]["rollout_is_threshold"] == 5.0
    assert shows(at, key, text)
    export_to(at, key, "prime-rl")
    text = download(at, files, "Download custom")
    assert "5.0" in text and shows(at, key, text)
