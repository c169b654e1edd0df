// seqis chart: a plotly figure drawn into a node this component keeps between reruns and updated in place
// (Plotly.react), where st.plotly_chart draws a changed figure anew. Plotly itself loads once per page, from the
// app's static folder (ui/plotly_js.py says which bundle). A chart far from the viewport draws when it comes near
// (its place on the page is kept meanwhile): a first load or a knob move pays for the charts a person can see.
function loadPlotly(src) {
  if (!window.__seqisPlotly) {
    window.__seqisPlotly = window.Plotly ? Promise.resolve(window.Plotly) : new Promise((resolve, reject) => {
      const s = document.createElement("script");
      s.src = src;
      s.onload = () => resolve(window.Plotly);
      s.onerror = () => {
        window.__seqisPlotly = null;
        reject(new Error("could not load " + src + ". Start the explorer with `python -m app` or `streamlit run " +
                         "app` from the repository's folder (its .streamlit/config.toml serves app/static)"));
      };
      document.head.appendChild(s);
    });
  }
  return window.__seqisPlotly;
}

const NEAR = "600px 0px";  // a chart within this distance of the visible part of the page draws at once
const watchers = new WeakMap();  // scrolling element -> the IntersectionObserver of the charts in it

function watch(node) {
  if (!window.IntersectionObserver) {
    node.__seqisNear = true;
    return;
  }
  // the page scrolls inside Streamlit's main element, not the window: observe against it, or the margin is lost
  const root = node.closest('[data-testid="stMain"]');
  let watcher = watchers.get(root || document);
  if (!watcher) {
    watcher = new IntersectionObserver(entries => {
      for (const e of entries) {
        e.target.__seqisNear = e.isIntersecting;
        if (e.isIntersecting) render(e.target);
      }
    }, {root, rootMargin: NEAR});
    watchers.set(root || document, watcher);
  }
  watcher.observe(node);
  node.__seqisWatcher = watcher;
}

function queue(node, work) {
  // Every plotly call on one chart (a draw, a resize, the purge at unmount) runs after the one before has settled:
  // a resize or a purge landing inside a draw's asynchronous margin pass left plotly reading a layout it had just
  // dropped ("Cannot read properties of undefined (reading '_redrawFromAutoMarginCount')", arrow-key slider moves).
  node.__seqisDraw = (node.__seqisDraw || Promise.resolve()).then(work);
  return node.__seqisDraw;
}

function react(P, node, spec) {
  // Plotly.react; if it throws on a node plotly left half drawn, purge and draw the figure afresh once.
  return Promise.resolve().then(() => P.react(node, spec.figure.data, spec.figure.layout, spec.config))
    .catch(() => { P.purge(node); return P.newPlot(node, spec.figure.data, spec.figure.layout, spec.config); });
}

function render(node) {
  // Draw the chart's newest figure if it is near the viewport and plotly has loaded, one draw at a time per chart.
  const spec = node.__seqisSpec;
  if (!node.__seqisNear || !window.Plotly || spec === node.__seqisDrawn) return;
  node.__seqisDrawn = spec;
  const P = window.Plotly;
  queue(node, () => react(P, node, spec)).then(() => {
      if (spec.click && !node.__seqisClick) {
        node.__seqisClick = true;
        node.on("plotly_click", ev => node.__seqisReport("click", pointOf(ev.points[0])));
      }
      if (!node.__seqisResize) {  // follow the column's width (plotly's own `responsive` leaks a window listener)
        let width = node.clientWidth;
        node.__seqisResize = new ResizeObserver(() => {
          // a node hidden or taken out of the page (before its unmount lets go of this observer) reports width 0,
          // and plotly refuses to resize a div that is not displayed: it is resized when it is shown again
          const w = node.clientWidth;
          if (w === width || !w || !node.isConnected || !node._fullLayout) return;
          width = w;
          queue(node, () => node._fullLayout && P.Plots.resize(node)).catch(() => {});  // hidden since: next change
        });
        node.__seqisResize.observe(node);
      }
    }).catch(e => {
      // a draw overtaken by a newer figure or by the unmount is not a failure: the newer one draws (or none is due)
      if (node.__seqisSpec === spec && node.isConnected) failed(node, e);
    });
}

function failed(node, e) {  // plotly.js did not load, or this figure did not draw: say so where the chart would be
  node.textContent = "This chart could not be drawn: " + e.message;
}

function pointOf(p) {  // what a click reports: JSON-safe fields of the point under the pointer
  return {curve: p.curveNumber, index: p.pointIndex ?? p.pointNumber, x: p.x, y: p.y,
          customdata: p.customdata ?? null, name: p.data && p.data.name};
}

export default function ({ data, parentElement, setTriggerValue }) {
  const text = typeof data === "string" ? data : new TextDecoder().decode(data);
  const same = parentElement.querySelector(":scope > .seqis-chart");
  if (same && same.__seqisText === text) {  // a rerun that left this figure as it was: nothing to parse or draw
    same.__seqisReport = setTriggerValue;
    return same.__seqisCleanup;
  }
  const spec = JSON.parse(text);
  if (!spec.figure) {  // preload: fetch and compile plotly when the page is idle, so the next page's charts draw at once
    const later = window.requestIdleCallback || (f => setTimeout(f, 200));
    later(() => loadPlotly(spec.plotly).catch(() => {}));
    return;
  }
  let node = parentElement.querySelector(":scope > .seqis-chart");
  if (!node) {
    node = document.createElement("div");
    node.className = "seqis-chart";
    node.style.width = "100%";
    parentElement.appendChild(node);
  }
  if (!node.__seqisWatcher) watch(node);
  node.style.minHeight = (spec.figure.layout.height || 450) + "px";  // the page keeps its place until it draws
  node.__seqisSpec = spec;
  node.__seqisText = text;
  node.__seqisReport = setTriggerValue;
  loadPlotly(spec.plotly).then(() => render(node), e => failed(node, e));
  node.__seqisCleanup = node.__seqisCleanup || (() => {  // unmounted: let go of plotly's state and the observers
    if (node.__seqisWatcher) node.__seqisWatcher.unobserve(node);
    if (node.__seqisResize) node.__seqisResize.disconnect();
    if (window.Plotly) queue(node, () => window.Plotly.purge(node)).catch(() => {});  // after a draw in flight
    // a node shown again (its cleanup can run while it stays) is watched and drawn anew
    node.__seqisWatcher = node.__seqisResize = node.__seqisText = node.__seqisDrawn = null;
  });
  return node.__seqisCleanup;
}
