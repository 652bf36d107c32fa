//! STUB (being written)
#![allow(missing_docs, unused)]
use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window { CalendarDays(u32), Rolling(chrono::Duration) }
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule { pub limit: u32, pub window: Window }
#[derive(Debug)]
pub struct WindowParseError(String);
impl std::fmt::Display for WindowParseError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str(&self.0) } }
impl std::error::Error for WindowParseError {}
impl std::str::FromStr for Window { type Err = WindowParseError; fn from_str(s: &str) -> Result<Self, Self::Err> { todo!() } }
impl std::fmt::Display for Window { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { todo!() } }
pub fn local_date(tz: Tz, at: DateTime<Utc>) -> NaiveDate { todo!() }
pub fn day_start(tz: Tz, date: NaiveDate) -> DateTime<Utc> { todo!() }
pub fn next_day_start(tz: Tz, at: DateTime<Utc>) -> DateTime<Utc> { todo!() }
pub fn counts(window: Window, tz: Tz, at: DateTime<Utc>, send: DateTime<Utc>) -> bool { todo!() }
pub fn window_start(window: Window, tz: Tz, at: DateTime<Utc>) -> (DateTime<Utc>, bool) { todo!() }
pub fn expires(window: Window, tz: Tz, send: DateTime<Utc>) -> DateTime<Utc> { todo!() }
pub fn admits(rules: &[Rule], tz: Tz, at: DateTime<Utc>, sends: &[DateTime<Utc>]) -> bool { todo!() }
pub fn earliest_allowed(rules: &[Rule], tz: Tz, now: DateTime<Utc>, sends: &[DateTime<Utc>]) -> Option<DateTime<Utc>> { todo!() }
