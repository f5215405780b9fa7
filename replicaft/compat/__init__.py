"""Compatibility surfaces for scripts written against other fault-tolerance libraries."""
