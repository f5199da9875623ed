"""prohost: a local harness that runs a chat service's agent requests on this machine."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("prohost")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

AGENT_HEADER_VALUE = f"prohost-python/{__version__}"
