import sys
from pathlib import Path

# Test helpers (virtual-time loop, in-memory transport) import as plain modules.
sys.path.insert(0, str(Path(__file__).parent))
