# args: ["name,age,city\nAlice,30,Paris\nBob,25,Berlin\nCara,35,Paris"]
import csv
import io

reader = csv.DictReader(io.StringIO(args[0]))
by_city = {}
for row in reader:
    by_city.setdefault(row["city"], []).append(row["name"])
return by_city
