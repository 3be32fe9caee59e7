# args: [[3, 1, 4, 1, 5, 9, 2, 6]]
from typing import List, Dict, Optional

def summarize(values: List[int]) -> Dict[str, float]:
    total: float = 0.0
    for v in values:
        total += v
    mean: float = total / len(values) if values else 0.0
    return {"total": total, "mean": mean}

def find_max(values: List[int]) -> Optional[int]:
    return max(values) if values else None

stats = summarize(args[0])
stats["max"] = find_max(args[0])
return stats
