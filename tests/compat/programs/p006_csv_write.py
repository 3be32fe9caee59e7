# args: [[["id", "score"], [1, 9.5], [2, 7.25]]]
import csv
import io

buf = io.StringIO()
writer = csv.writer(buf)
for row in args[0]:
    writer.writerow(row)
return buf.getvalue()
