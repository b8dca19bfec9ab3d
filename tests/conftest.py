import sys
from pathlib import Path

# Test helpers (engine_helpers, console_fixtures, fault_server) import as plain modules.
sys.path.insert(0, str(Path(__file__).parent))
