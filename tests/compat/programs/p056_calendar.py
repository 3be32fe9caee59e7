# args: [2024, 2]
import calendar

year, month = args
first_weekday, days = calendar.monthrange(year, month)
return {
    "leap": calendar.isleap(year),
    "days": days,
    "first": calendar.day_name[first_weekday],
    "month": calendar.month_name[month],
}
