"""``import r3store.replay`` without torch: an ImportError naming the extra to install."""

from __future__ import annotations

import subprocess
import sys


def test_import_without_torch_names_the_extra() -> None:
    code = ("import sys\nsys.modules['torch'] = None\ntry:\n    import r3store.replay\nexcept ImportError as exc:\n"
            "    print(type(exc).__name__, exc)\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.startswith("ImportError r3store.replay needs PyTorch")
    assert "pip install 'r3store[torch]'" in out
