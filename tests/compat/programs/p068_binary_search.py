# args: [[1, 3, 5, 7, 9, 11, 13], [7, 2, 13]]
def binary_search(arr, target):
    lo, hi = 0, len(arr) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if arr[mid] == target:
            return mid
        elif arr[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1

arr, targets = args
return [binary_search(arr, t) for t in targets]
