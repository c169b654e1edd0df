"""seqis explorer: `streamlit run app`."""

import streamlit as st

st.set_page_config(page_title="seqis", layout="wide")
st.title("seqis")
st.write("The explorer is being built.")
