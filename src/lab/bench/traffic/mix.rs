//! The protocol mix: the classes of frame generated and their shares.

use std::fmt;
use std::str::FromStr;

use crate::ConfigError;

/// What kind of frame a generated packet is.
///
/// The filter program forwards [`FrameClass::Ipv4`], counts [`FrameClass::Ipv4Options`] as
/// "IP options" and counts both [`FrameClass::Ipv6`] and [`FrameClass::NonIp`] as "non-IP"
/// (its IP test is EtherType `0x0800`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum FrameClass {
    /// IPv4 without options, carrying UDP.
    Ipv4,
    /// IPv4 with a 4-byte option (`ihl` 6), carrying UDP.
    Ipv4Options,
    /// IPv6 without extension headers, carrying UDP.
    Ipv6,
    /// Not IP (ARP EtherType).
    NonIp,
}

impl FrameClass {
    /// Every class, in declaration order.
    pub const ALL: [FrameClass; 4] = [
        FrameClass::Ipv4,
        FrameClass::Ipv4Options,
        FrameClass::Ipv6,
        FrameClass::NonIp,
    ];

    /// Position in [`FrameClass::ALL`].
    pub(super) fn index(self) -> usize {
        match self {
            FrameClass::Ipv4 => 0,
            FrameClass::Ipv4Options => 1,
            FrameClass::Ipv6 => 2,
            FrameClass::NonIp => 3,
        }
    }

    /// The class's key in [`Mix`]'s text form.
    pub fn key(self) -> &'static str {
        match self {
            FrameClass::Ipv4 => "ipv4",
            FrameClass::Ipv4Options => "ipv4opt",
            FrameClass::Ipv6 => "ipv6",
            FrameClass::NonIp => "nonip",
        }
    }
}

/// The protocol mix, in parts per hundred; must sum to 100.
///
/// Text form ([`FromStr`] / [`Display`](fmt::Display)): comma-separated `class=share`
/// with classes `ipv4`, `ipv4opt`, `ipv6` and `nonip` (also accepted: `ipv4_options`,
/// `ipv4-options`, `non_ip`, `non-ip`, `arp`), e.g. `ipv4=90,ipv4opt=5,ipv6=0,nonip=5`.
/// Omitted classes get 0; each class at most once; the shares must sum to 100.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    /// Share of [`FrameClass::Ipv4`] frames.
    pub ipv4: u32,
    /// Share of [`FrameClass::Ipv4Options`] frames.
    pub ipv4_options: u32,
    /// Share of [`FrameClass::Ipv6`] frames.
    pub ipv6: u32,
    /// Share of [`FrameClass::NonIp`] frames.
    pub non_ip: u32,
}

impl Mix {
    /// The filter benchmark's mix: 90% plain IPv4, 5% IPv4 with options, no IPv6, 5%
    /// non-IP.
    pub const FILTER_DEFAULT: Mix = Mix {
        ipv4: 90,
        ipv4_options: 5,
        ipv6: 0,
        non_ip: 5,
    };

    /// The share of `class`.
    pub fn share(&self, class: FrameClass) -> u32 {
        match class {
            FrameClass::Ipv4 => self.ipv4,
            FrameClass::Ipv4Options => self.ipv4_options,
            FrameClass::Ipv6 => self.ipv6,
            FrameClass::NonIp => self.non_ip,
        }
    }

    fn share_mut(&mut self, class: FrameClass) -> &mut u32 {
        match class {
            FrameClass::Ipv4 => &mut self.ipv4,
            FrameClass::Ipv4Options => &mut self.ipv4_options,
            FrameClass::Ipv6 => &mut self.ipv6,
            FrameClass::NonIp => &mut self.non_ip,
        }
    }

    /// Checks that the shares sum to 100; the error names `mix`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let sum: u64 = FrameClass::ALL
            .iter()
            .map(|&c| u64::from(self.share(c)))
            .sum();
        if sum != 100 {
            return Err(ConfigError::new(
                "mix",
                format!(
                    "shares must sum to 100, got {} + {} + {} + {} = {sum} \
                     (ipv4 + ipv4opt + ipv6 + nonip)",
                    self.ipv4, self.ipv4_options, self.ipv6, self.non_ip
                ),
            ));
        }
        Ok(())
    }

    /// The class of a draw `r` in `0..100` (classes in [`FrameClass::ALL`] order).
    pub(super) fn pick(&self, r: u32) -> FrameClass {
        let mut r = r;
        for class in FrameClass::ALL {
            let share = self.share(class);
            if r < share {
                return class;
            }
            r -= share;
        }
        FrameClass::NonIp
    }
}

impl Default for Mix {
    fn default() -> Self {
        Mix::FILTER_DEFAULT
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        for class in FrameClass::ALL {
            write!(f, "{sep}{}={}", class.key(), self.share(class))?;
            sep = ",";
        }
        Ok(())
    }
}

impl FromStr for Mix {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Mix, ConfigError> {
        const EXPECTED: &str = "expected comma-separated class=share with classes ipv4, \
                                ipv4opt, ipv6, nonip, e.g. `ipv4=90,ipv4opt=5,ipv6=0,nonip=5`";
        let mut mix = Mix {
            ipv4: 0,
            ipv4_options: 0,
            ipv6: 0,
            non_ip: 0,
        };
        let mut seen = [false; 4];
        if s.trim().is_empty() {
            return Err(ConfigError::new("mix", format!("empty; {EXPECTED}")));
        }
        for item in s.split(',') {
            let item = item.trim();
            let Some((key, value)) = item.split_once('=') else {
                return Err(ConfigError::new(
                    "mix",
                    format!("`{item}` is not class=share; {EXPECTED}"),
                ));
            };
            let class = match key.trim().to_ascii_lowercase().as_str() {
                "ipv4" => FrameClass::Ipv4,
                "ipv4opt" | "ipv4_options" | "ipv4-options" => FrameClass::Ipv4Options,
                "ipv6" => FrameClass::Ipv6,
                "nonip" | "non_ip" | "non-ip" | "arp" => FrameClass::NonIp,
                other => {
                    return Err(ConfigError::new(
                        "mix",
                        format!("unknown class `{other}`; {EXPECTED}"),
                    ))
                }
            };
            if std::mem::replace(&mut seen[class.index()], true) {
                return Err(ConfigError::new(
                    "mix",
                    format!("class `{}` given twice", class.key()),
                ));
            }
            let value = value.trim();
            *mix.share_mut(class) = value.parse::<u32>().map_err(|_| {
                ConfigError::new(
                    "mix",
                    format!(
                        "share `{value}` of `{}` is not a whole number of percent",
                        class.key()
                    ),
                )
            })?;
        }
        mix.validate()?;
        Ok(mix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_pick_covers_each_class_by_its_share() {
        let mix = Mix {
            ipv4: 10,
            ipv4_options: 20,
            ipv6: 30,
            non_ip: 40,
        };
        let mut counts = [0u32; 4];
        for r in 0..100 {
            counts[mix.pick(r).index()] += 1;
        }
        assert_eq!(counts, [10, 20, 30, 40]);
        assert_eq!(mix.pick(9), FrameClass::Ipv4);
        assert_eq!(mix.pick(10), FrameClass::Ipv4Options);
        assert_eq!(mix.pick(30), FrameClass::Ipv6);
        assert_eq!(mix.pick(60), FrameClass::NonIp);
        // The filter default has no IPv6: draws 95..100 stay non-IP.
        assert!((95..100).all(|r| Mix::FILTER_DEFAULT.pick(r) == FrameClass::NonIp));
    }
}
