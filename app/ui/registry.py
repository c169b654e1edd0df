"""The one place the app reaches the library's name lookup: a registry estimator's or a preset's entry (its spec
and start config), its composition (`resolve`) and its words (`about`), from seqis.registry."""

from seqis.registry import About, about, entry, resolve

__all__ = ["About", "about", "entry", "resolve"]
