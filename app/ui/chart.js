// seqis chart: a plotly figure drawn into a node this component keeps between reruns and updated in place
// (Plotly.react), where st.plotly_chart draws a changed figure anew. Plotly itself loads once per page, from the
// app's static folder (ui/plotly_js.py says which bundle).
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

function pointOf(p) {  // what a click reports: JSON-safe fields of the point under the pointer
  return {curve: p.curveNumber, index: p.pointIndex ?? p.pointNumber, x: p.x, y: p.y,
          customdata: p.customdata ?? null, name: p.data && p.data.name};
}

export default function ({ data, parentElement, setTriggerValue }) {
  const spec = JSON.parse(typeof data === "string" ? data : new TextDecoder().decode(data));
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
  node.style.minHeight = (spec.figure.layout.height || 450) + "px";  // the page keeps its place while plotly loads
  const draw = loadPlotly(spec.plotly).then(P => {
    // one draw at a time per chart, the newest figure last
    node.__seqisDraw = (node.__seqisDraw || Promise.resolve()).then(() =>
      P.react(node, spec.figure.data, spec.figure.layout, spec.config)).then(() => {
        if (spec.click && !node.__seqisClick) {
          node.__seqisClick = true;
          node.on("plotly_click", ev => setTriggerValue("click", pointOf(ev.points[0])));
        }
        if (!node.__seqisResize) {  // follow the column's width (plotly's own `responsive` leaks a window listener)
          let width = node.clientWidth;
          node.__seqisResize = new ResizeObserver(() => {
            if (node.clientWidth !== width && node._fullLayout) { width = node.clientWidth; P.Plots.resize(node); }
          });
          node.__seqisResize.observe(node);
        }
      });
    return node.__seqisDraw;
  });
  draw.catch(e => { node.textContent = "This chart could not be drawn: " + e.message; });
  return () => {  // unmounted: let go of plotly's state and the observer
    if (node.__seqisResize) node.__seqisResize.disconnect();
    if (window.Plotly) window.Plotly.purge(node);
  };
}
