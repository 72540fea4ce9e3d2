//! `strftime_now(format)`, which transformers gives templates that print today's date
//! (Llama 3.2, Mistral Small 3, gpt-oss): Python's `datetime.now().strftime(format)`, in UTC.

/// A civil date and time, from seconds since the Unix epoch (UTC).
struct Civil {
    year: i64,
    month: u32,
    day: u32,
    yday: u32,
    weekday: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

fn civil(unix_seconds: i64) -> Civil {
    let days = unix_seconds.div_euclid(86_400);
    let secs = unix_seconds.rem_euclid(86_400) as u32;
    // Walk to the year and month from 1970-01-01 (a Thursday) in 400-year eras.
    let era_days = 146_097;
    let mut year = 1970 + 400 * days.div_euclid(era_days);
    let mut rest = days.rem_euclid(era_days);
    loop {
        let len = if is_leap(year) { 366 } else { 365 };
        if rest < len {
            break;
        }
        rest -= len;
        year += 1;
    }
    let yday = rest as u32;
    let mut month = 0;
    let mut left = yday;
    loop {
        let len = match month {
            1 if is_leap(year) => 29,
            1 => 28,
            3 | 5 | 8 | 10 => 30,
            _ => 31,
        };
        if left < len {
            break;
        }
        left -= len;
        month += 1;
    }
    Civil {
        year,
        month: month + 1,
        day: left + 1,
        yday: yday + 1,
        weekday: (days + 3).rem_euclid(7) as u32,
        hour: secs / 3600,
        minute: secs / 60 % 60,
        second: secs % 60,
    }
}

/// `format` with the C/Python directives a date line uses (`%Y %y %m %d %e %j %b %B %h %a %A %H
/// %I %p %M %S %F %D %T %%`); any other directive is written as is, as glibc does.
pub fn strftime(format: &str, unix_seconds: i64) -> String {
    let t = civil(unix_seconds);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let month = MONTHS[t.month as usize - 1];
        let weekday = WEEKDAYS[t.weekday as usize];
        let hour12 = (t.hour + 11) % 12 + 1;
        let piece = match d {
            'Y' => t.year.to_string(),
            'y' => format!("{:02}", t.year.rem_euclid(100)),
            'm' => format!("{:02}", t.month),
            'd' => format!("{:02}", t.day),
            'e' => format!("{:2}", t.day),
            'j' => format!("{:03}", t.yday),
            'b' | 'h' => month[..3].to_string(),
            'B' => month.to_string(),
            'a' => weekday[..3].to_string(),
            'A' => weekday.to_string(),
            'H' => format!("{:02}", t.hour),
            'I' => format!("{hour12:02}"),
            'p' => if t.hour < 12 { "AM" } else { "PM" }.to_string(),
            'M' => format!("{:02}", t.minute),
            'S' => format!("{:02}", t.second),
            'F' => format!("{}-{:02}-{:02}", t.year, t.month, t.day),
            'D' => format!("{:02}/{:02}/{:02}", t.month, t.day, t.year.rem_euclid(100)),
            'T' => format!("{:02}:{:02}:{:02}", t.hour, t.minute, t.second),
            '%' => "%".to_string(),
            other => format!("%{other}"),
        };
        out.push_str(&piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::strftime;

    #[test]
    fn formats_like_python() {
        // 2026-03-07 12:00:00 UTC, a Saturday.
        let t = 1_772_884_800;
        assert_eq!(strftime("%d %b %Y", t), "07 Mar 2026");
        assert_eq!(strftime("%Y-%m-%d", t), "2026-03-07");
        assert_eq!(
            strftime("%A %a %B %e %j %H:%M:%S %I%p %y %F %D %T 100%% %Q", t),
            "Saturday Sat March  7 066 12:00:00 12PM 26 2026-03-07 03/07/26 12:00:00 100% %Q"
        );
        assert_eq!(strftime("%F %T %a", 0), "1970-01-01 00:00:00 Thu");
        // Leap days, the end of a leap year, a century that is not leap, and one before 1970.
        assert_eq!(strftime("%F %j", 951_782_400), "2000-02-29 060");
        assert_eq!(strftime("%F %j %a", 1_735_603_200), "2024-12-31 366 Tue");
        assert_eq!(strftime("%F %a", 4_107_542_400), "2100-03-01 Mon");
        assert_eq!(strftime("%F %T", -1), "1969-12-31 23:59:59");
    }
}
