# args: [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 3]
values, window = args
averages = []
window_sum = 0
for i, v in enumerate(values):
    window_sum += v
    if i >= window:
        window_sum -= values[i - window]
    if i >= window - 1:
        averages.append(round(window_sum / window, 2))
return averages
