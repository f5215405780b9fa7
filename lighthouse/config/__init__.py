"""Configuration of the lighthouse server, checked once when it is built.

``options.py`` (``LighthouseOptions``, ``MembershipOptions``) and ``option_checks.py`` (the
range checks every options dataclass of the lighthouse shares).
"""
