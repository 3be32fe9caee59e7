# args: [[2, 4, 4, 4, 5, 5, 7, 9]]
import statistics

data = args[0]
return {
    "mean": statistics.mean(data),
    "median": statistics.median(data),
    "mode": statistics.mode(data),
    "pstdev": statistics.pstdev(data),
}
