/// The `Date` header's form (RFC 9110 §5.6.7, IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`) of a
/// second of Unix time, computed with integer arithmetic alone: no calendar, no time zone, no
/// allocation beyond the string. Years 1–9999 only (an IMF-fixdate has four digits); a time
/// outside them is written as the nearest second inside.
public enum HTTPDate {
    static let days = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"]  // 1970-01-01 was a Thursday
    static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    /// 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z in Unix time.
    static let earliest: Int64 = -62_135_596_800
    static let latest: Int64 = 253_402_300_799

    public static func format(unixSeconds: Int64) -> String {
        let t = min(max(unixSeconds, earliest), latest)
        let (dayNumber, second) = floorDivision(t, 86_400)
        let (year, month, day) = civil(daysSinceEpoch: dayNumber)
        let weekday = days[Int(floorDivision(dayNumber, 7).remainder)]
        var text = weekday + ", " + pad(day, 2) + " " + months[month - 1] + " " + pad(year, 4) + " "
        text += pad(Int(second / 3600), 2) + ":" + pad(Int(second / 60 % 60), 2) + ":" + pad(Int(second % 60), 2)
        return text + " GMT"
    }

    /// Year, month (1–12) and day (1–31) of a day counted from 1970-01-01, in the proleptic
    /// Gregorian calendar (Howard Hinnant's `civil_from_days`).
    static func civil(daysSinceEpoch z: Int64) -> (year: Int, month: Int, day: Int) {
        let shifted = z + 719_468
        let era = floorDivision(shifted, 146_097).quotient
        let dayOfEra = shifted - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let shiftedMonth = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * shiftedMonth + 2) / 5 + 1
        let month = shiftedMonth < 10 ? shiftedMonth + 3 : shiftedMonth - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        return (Int(year), Int(month), Int(day))
    }

    static func floorDivision(_ a: Int64, _ b: Int64) -> (quotient: Int64, remainder: Int64) {
        let q = a / b - (a % b < 0 ? 1 : 0)
        return (q, a - q * b)
    }

    static func pad(_ value: Int, _ width: Int) -> String {
        let digits = String(value)
        return String(repeating: "0", count: max(0, width - digits.count)) + digits
    }
}
