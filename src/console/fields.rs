//! A form's fields or a query's, as the console's pages and actions read them.
//! Pure.

use std::collections::HashMap;

/// A form's fields (or a query's), each trimmed; empty ones left out.
#[derive(Debug, Default)]
pub(super) struct Fields(HashMap<String, String>);

impl Fields {
    pub fn parse(text: &[u8]) -> Fields {
        Fields(
            form_urlencoded::parse(text)
                .map(|(k, v)| (k.into_owned(), v.trim().to_string()))
                .filter(|(_, v)| !v.is_empty())
                .collect(),
        )
    }

    pub fn of_query(uri: &axum::http::Uri) -> Fields {
        Fields::parse(uri.query().unwrap_or("").as_bytes())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
}
