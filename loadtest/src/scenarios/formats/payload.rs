//! The two payloads of issue #26's table, each a deterministic series (the
//! same bytes every run, so runs and builds compare):
//! - [`Kind::Chat`]: chat messages of about 200 bytes of JSON, each new
//!   (a room, an id, a user, a time, a line of words).
//! - [`Kind::State`]: a football match's scoreboard of 2 to 4 KiB of JSON
//!   (two teams, 22 players with their figures), where each update changes a
//!   few fields (the clock, the version, two or three players' figures, now
//!   and then a goal): a state topic, the case deltas are for.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A payload series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Chat,
    State,
}

impl Kind {
    pub const ALL: [Self; 2] = [Self::Chat, Self::State];

    pub fn name(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::State => "state",
        }
    }

    /// The first `count` payloads of the series, as JSON text.
    pub fn series(self, count: usize) -> Vec<String> {
        match self {
            Self::Chat => chat(count),
            Self::State => state(count),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("`{s}`: chat or state"))
    }
}

/// xorshift64*: the series' only source of variety, seeded per series.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len() as u64) as usize]
    }
}

/// The first time of both series, milliseconds since the epoch (a fixed day).
const EPOCH_MS: u64 = 1_765_000_000_000;

const WORDS: &[&str] = &[
    "the", "match", "was", "great", "did", "you", "see", "that", "goal", "keeper", "should",
    "have", "stopped", "it", "what", "a", "pass", "from", "midfield", "I", "think", "we", "win",
    "this", "one", "second", "half", "is", "going", "to", "be", "tense", "ref", "missed", "clear",
    "foul", "on", "our", "striker", "again", "lol", "no", "way", "corner", "coming", "up",
    "tonight", "anyone", "watching", "stream", "lagging", "for", "me", "too", "fine", "here",
];
const NAMES: &[&str] = &[
    "Mira Okafor",
    "Jonas Berg",
    "Ana Lima",
    "Kenji Sato",
    "Lea Novak",
    "Omar Haddad",
    "Priya Nair",
    "Tomás Ruiz",
    "Sofia Rossi",
    "Ilya Petrov",
    "Grace Mensah",
    "Lukas Weber",
];

/// A chat message.
#[derive(Serialize)]
struct Chat<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    room: &'static str,
    id: u64,
    user: User<'a>,
    ts: u64,
    text: String,
}

#[derive(Serialize)]
struct User<'a> {
    id: String,
    name: &'a str,
}

fn chat(count: usize) -> Vec<String> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    (0..count as u64)
        .map(|i| {
            let mut text = String::new();
            let words = 12 + rng.below(8);
            for w in 0..words {
                if w > 0 {
                    text.push(' ');
                }
                text.push_str(rng.pick(WORDS));
            }
            let user = rng.below(NAMES.len() as u64);
            let message = Chat {
                kind: "chat",
                room: "match-lobby",
                id: 10_000 + i,
                user: User {
                    id: format!("u-{:04}", 1000 + user * 37),
                    name: NAMES[user as usize],
                },
                ts: EPOCH_MS + i * 1_250 + rng.below(1_000),
                text,
            };
            serde_json::to_string(&message).unwrap_or_default()
        })
        .collect()
}

/// The scoreboard.
#[derive(Serialize)]
struct Board {
    #[serde(rename = "match")]
    match_id: &'static str,
    competition: &'static str,
    status: &'static str,
    period: u8,
    clock_ms: u64,
    version: u64,
    updated: u64,
    teams: [Team; 2],
    players: Vec<Player>,
}

#[derive(Serialize)]
struct Team {
    id: &'static str,
    name: &'static str,
    score: u32,
    shots: u32,
    on_target: u32,
    corners: u32,
    fouls: u32,
    possession: u32,
}

#[derive(Serialize)]
struct Player {
    id: String,
    name: &'static str,
    team: &'static str,
    number: u32,
    position: &'static str,
    goals: u32,
    assists: u32,
    shots: u32,
    passes: u32,
    tackles: u32,
    /// Tenths: 68 is 6.8.
    rating: u32,
    minutes: u32,
}

const PLAYERS: &[&str] = &[
    "Aaron Ward",
    "Bruno Costa",
    "Caleb Price",
    "Dario Conti",
    "Eli Moreau",
    "Felix Braun",
    "Gabriel Silva",
    "Hugo Martin",
    "Ivan Horvat",
    "Jakub Nowak",
    "Kai Schmidt",
    "Leon Dubois",
    "Marco Bianchi",
    "Nico Jansen",
    "Oscar Lind",
    "Pavel Kral",
    "Quinn Harris",
    "Rafael Gomez",
    "Samir Aziz",
    "Theo Laurent",
    "Umar Bello",
    "Victor Sousa",
];
const POSITIONS: &[&str] = &[
    "GK", "RB", "CB", "CB", "LB", "DM", "CM", "CM", "RW", "ST", "LW",
];

fn state(count: usize) -> Vec<String> {
    let mut rng = Rng(0xd1b5_4a32_d192_ed03);
    let team = |id, name| Team {
        id,
        name,
        score: 0,
        shots: 0,
        on_target: 0,
        corners: 0,
        fouls: 0,
        possession: 50,
    };
    let mut board = Board {
        match_id: "m-2026-12-07-final",
        competition: "Northern Cup",
        status: "live",
        period: 1,
        clock_ms: 0,
        version: 1,
        updated: EPOCH_MS,
        teams: [
            team("home", "Northside Rovers"),
            team("away", "Harbour City"),
        ],
        players: PLAYERS
            .iter()
            .enumerate()
            .map(|(i, &name)| Player {
                id: format!("p{:02}", i + 1),
                name,
                team: if i < 11 { "home" } else { "away" },
                number: 1 + (i as u32 % 11) * 2,
                position: POSITIONS[i % 11],
                goals: 0,
                assists: 0,
                shots: 0,
                passes: 0,
                tackles: 0,
                rating: 60,
                minutes: 0,
            })
            .collect(),
    };
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        out.push(serde_json::to_string(&board).unwrap_or_default());
        // The next update: a few seconds of play.
        let step = 2_000 + rng.below(3_000);
        board.clock_ms += step;
        board.updated += step;
        board.version += 1;
        let minutes = (board.clock_ms / 60_000) as u32;
        for p in 0..2 + rng.below(2) {
            let i = rng.below(PLAYERS.len() as u64) as usize;
            let player = &mut board.players[i];
            player.minutes = minutes;
            match (p, rng.below(10)) {
                (_, 0) => player.tackles += 1,
                (_, 1) => {
                    player.shots += 1;
                    board.teams[i / 11].shots += 1;
                }
                _ => player.passes += 1 + rng.below(3) as u32,
            }
            player.rating = (player.rating + rng.below(3) as u32).min(99);
        }
        if rng.below(40) == 0 {
            let scorer = rng.below(PLAYERS.len() as u64) as usize;
            board.players[scorer].goals += 1;
            board.teams[scorer / 11].score += 1;
            board.teams[scorer / 11].on_target += 1;
        }
        if rng.below(8) == 0 {
            let home = 40 + rng.below(21) as u32;
            board.teams[0].possession = home;
            board.teams[1].possession = 100 - home;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_is_about_200_bytes_of_json_each_message_new() {
        let series = Kind::Chat.series(100);
        let mean = series.iter().map(String::len).sum::<usize>() / series.len();
        assert!((170..=240).contains(&mean), "mean {mean} B: {}", series[0]);
        for text in &series {
            serde_json::from_str::<serde_json::Value>(text).expect("JSON");
        }
        assert_ne!(series[0], series[1]);
        assert_eq!(series, Kind::Chat.series(100), "deterministic");
    }

    #[test]
    fn state_is_a_2_to_4_kib_scoreboard_that_changes_a_little() {
        let series = Kind::State.series(300);
        for text in &series {
            assert!((2048..=4096).contains(&text.len()), "{} B", text.len());
            serde_json::from_str::<serde_json::Value>(text).expect("JSON");
        }
        assert_eq!(series, Kind::State.series(300), "deterministic");
        // Each update differs from the one before, by a few fields.
        for pair in series.windows(2) {
            assert_ne!(pair[0], pair[1]);
            let changed = pair[0]
                .split(',')
                .zip(pair[1].split(','))
                .filter(|(a, b)| a != b)
                .count();
            assert!((3..=16).contains(&changed), "{changed} fields changed");
        }
    }
}
