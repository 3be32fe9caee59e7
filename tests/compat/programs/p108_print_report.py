# args: [{"cpu": 73.5, "mem": 41.2, "disk": 90.1}]
alerts = []
for metric, value in sorted(args[0].items()):
    status = "ALERT" if value > 80 else "ok"
    print(f"{metric:>5}: {value:5.1f}% {status}")
    if status == "ALERT":
        alerts.append(metric)
return {"alerts": alerts}
