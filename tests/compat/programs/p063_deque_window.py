# args: [[1, 3, -1, -3, 5, 3, 6, 7], 3]
from collections import deque

nums, k = args
dq = deque()
out = []
for i, n in enumerate(nums):
    while dq and dq[0] <= i - k:
        dq.popleft()
    while dq and nums[dq[-1]] < n:
        dq.pop()
    dq.append(i)
    if i >= k - 1:
        out.append(nums[dq[0]])
return out
