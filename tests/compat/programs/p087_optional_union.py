# args: [["42", "x", "3.5", null]]
from typing import Optional, Union, Any

def parse_number(value: Any) -> Optional[Union[int, float]]:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return None

return [parse_number(v) for v in args[0]]
