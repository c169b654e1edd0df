"""What the explorer runs on that Streamlit does not give it, and why each stays custom (measured on 2 loaded
cores; docs/explorer.md has the numbers and the commands):

    chart.py + chart.js  every chart: a component that keeps its plotly node between reruns and updates it in place
                         (Plotly.react), and draws a chart only when it comes near the viewport. st.plotly_chart puts
                         the figure into the element's identity, so a slider move rebuilds each changed chart from
                         nothing, and it draws every chart of a page on its first load.
    memo.py              the lab's Monte Carlo runs (seconds each): one LRU shared by every session, which a page asks
                         with a progress bar for a miss and gets the stored result at once on a hit; st.cache_data
                         cannot drive a progress bar on a miss while replaying nothing on a hit.

Everything else caches with Streamlit's own st.cache_resource / st.cache_data (the bridges in ui/).
"""
