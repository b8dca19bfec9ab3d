import os
import sys
import tempfile
from pathlib import Path

# Test helpers (engine_helpers, console_fixtures, fault_server) import as plain modules.
sys.path.insert(0, str(Path(__file__).parent))

# A run that names no graveyard and writes no report puts it under the XDG state
# directory: the tests' runs (and their child processes) use one of their own.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="ratedeck-state-")
