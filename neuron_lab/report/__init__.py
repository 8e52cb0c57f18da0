"""The report data model and its renderers (text, HTML, JSON); widgets read the same model."""

from neuron_lab.report.model import Compiles, GraphBreak, Memory, OpRow, Recompile, Report, Site, SiteCount

__all__ = ["Compiles", "GraphBreak", "Memory", "OpRow", "Recompile", "Report", "Site", "SiteCount"]
