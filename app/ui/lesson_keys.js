// Lessons' keys and scroll: a clicker's keys press the screen's buttons (right arrow / PageDown: Next, left arrow /
// PageUp: Back, R: Reveal), and a new screen opens scrolled to the top (Streamlit keeps the old scroll offset).
// The buttons are found by their keys' classes (st-key-ls-next-N ...), so a label's translation cannot break it.
const KEYS = {ArrowRight: "next", PageDown: "next", ArrowLeft: "back", PageUp: "back", r: "reveal", R: "reveal"};

function press(what) {
  const buttons = document.querySelectorAll(`[data-testid="stMain"] [class*="st-key-ls-${what}-"] button`);
  const button = [...buttons].find(b => !b.disabled);
  if (button) button.click();
  return !!button;
}

function onKey(e) {
  if (e.altKey || e.ctrlKey || e.metaKey) return;
  const t = e.target;
  if (t && (t.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(t.tagName))) return;
  if (t && t.getAttribute && t.getAttribute("role") === "slider" && e.key.startsWith("Arrow")) return;  // a slider's own keys
  const what = KEYS[e.key];
  if (what && press(what)) e.preventDefault();
}

function toTop() {
  const main = document.querySelector('[data-testid="stMain"]');
  for (const node of [main, document.scrollingElement, document.querySelector('[data-testid="stAppViewContainer"]')]) {
    if (node) node.scrollTop = 0;
  }
  window.scrollTo(0, 0);
}

export default function ({ data }) {
  const step = typeof data === "string" ? data : new TextDecoder().decode(data);
  if (!window.__seqisLessonKeys) {
    window.__seqisLessonKeys = true;
    document.addEventListener("keydown", onKey);
  }
  if (window.__seqisLessonStep !== step) {
    window.__seqisLessonStep = step;
    toTop();
    requestAnimationFrame(toTop);  // once more after the new screen's elements are laid out
    setTimeout(toTop, 150);
  }
}
