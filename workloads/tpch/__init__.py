"""TPC-H: the 22 query templates with their substitution parameters, and the thesis' mixes."""

from workloads.tpch.mixes import MIXES, QUERY_GROUPS, Mix, mix_by_name
from workloads.tpch.queries import DIALECTS, QUERY_NUMBERS, draw_parameters, render_query

__all__ = [
    "DIALECTS",
    "MIXES",
    "QUERY_GROUPS",
    "QUERY_NUMBERS",
    "Mix",
    "draw_parameters",
    "mix_by_name",
    "render_query",
]
