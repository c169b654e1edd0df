"""The device every page computes on: CUDA when present, else the CPU."""

from __future__ import annotations

import streamlit as st
import torch


@st.cache_resource
def device() -> torch.device:
    """CUDA when present, else CPU: every batch and Monte Carlo run of the explorer lives here."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def device_label() -> str:
    d = device()
    if d.type == "cuda":
        return f"CUDA ({torch.cuda.get_device_name(d)})"
    return f"CPU ({torch.get_num_threads()} threads)"
