"""``python -m fused_lce.integrations.startup`` prints the folder to put on PYTHONPATH."""
from . import DIR

print(DIR)
