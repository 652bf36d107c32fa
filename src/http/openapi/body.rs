//! The bodies `PUT` and `PATCH` take, as JSON Schemas that say exactly what the
//! parser (`preferences::set::Preferences::parse`) accepts, built from the set's
//! schema file: it holds for every worker; these add what one worker knows (its
//! channels, the zones of its tz database) and what JSON Schema can only say long
//! (a window's `from` and `to` differ). Pure: no I/O.

use serde_json::{json, Value};

/// The set `PUT` takes (and a `PATCH` must leave): `schema` (the schema file's) with
/// the channel names limited to `channels` (when known), the zone to a name of the
/// tz database, and a window that opens for some time. `updated_at` is any value:
/// the parser ignores it.
pub fn set(mut schema: Value, channels: Option<&[String]>) -> Value {
    let props = &mut schema["properties"];
    if let Some(channels) = channels {
        let names = json!(channels);
        props["channels"]["propertyNames"]["enum"] = names.clone();
        for choice in props["categories"]["additionalProperties"]["oneOf"]
            .as_array_mut()
            .into_iter()
            .flatten()
            .filter(|c| c["type"] == "object")
        {
            choice["propertyNames"]["enum"] = names.clone();
        }
    }
    let quiet = &mut props["quiet_hours"]["properties"];
    quiet["timezone"]["$ref"] = json!(format!("{COMPONENTS}{ZONE}"));
    quiet["windows"]["items"]["not"] = json!({ "$ref": format!("{COMPONENTS}{EMPTY_WINDOW}") });
    let docs = props["updated_at"]["description"].clone();
    props["updated_at"] = json!({ "description": docs });
    schema
}

/// Where the document keeps the schemas the bodies share.
pub const COMPONENTS: &str = "#/components/schemas/";
/// The component of a zone name.
pub const ZONE: &str = "TimeZone";
/// The component of a window that opens for no time.
pub const EMPTY_WINDOW: &str = "EmptyWindow";

/// The shared components, by name: a zone is a name of the tz database, exactly as
/// written there; a window from a time of day to itself opens for no time.
pub fn components() -> Vec<(&'static str, Value)> {
    let zones: Vec<&str> = chrono_tz::TZ_VARIANTS.iter().map(|z| z.name()).collect();
    let empty: Vec<Value> = (0..24 * 60)
        .map(|m| format!("{:02}:{:02}", m / 60, m % 60))
        .map(|t| json!({ "required": ["from", "to"], "properties": { "from": { "const": t }, "to": { "const": t } } }))
        .collect();
    vec![
        (ZONE, json!({ "type": "string", "enum": zones })),
        (EMPTY_WINDOW, json!({ "anyOf": empty })),
    ]
}

/// The body `PATCH` takes (RFC 7386): `set` where, at any depth but inside a list (a
/// list is replaced whole), every key may be left out (the stored set may have it: a
/// `quiet_hours` without `windows` where it has none answers 409) and every key
/// `set` does not require may be `null` (it removes the key).
pub fn patch(mut set: Value) -> Value {
    nullable_inside(&mut set);
    set
}

fn nullable_inside(schema: &mut Value) {
    let required: Vec<Value> = schema["required"].as_array().cloned().unwrap_or_default();
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        for (name, prop) in props.iter_mut() {
            nullable_inside(prop);
            if !required.contains(&json!(name)) {
                *prop = or_null(prop.take());
            }
        }
    }
    if let Some(m) = schema.as_object_mut() {
        m.remove("required");
    }
    if let Some(mut extra) = schema
        .get_mut("additionalProperties")
        .filter(|e| e.is_object())
        .map(Value::take)
    {
        nullable_inside(&mut extra);
        let extra = or_null(extra);
        // a key `null` removes is never read, so its name is not checked: the names
        // the set allows take a value or `null`, any other name `null` alone
        let names = schema
            .as_object_mut()
            .and_then(|m| m.remove("propertyNames"))
            .unwrap_or_default();
        if let Some(known) = names["enum"].as_array() {
            let each = known.iter().filter_map(Value::as_str);
            schema["properties"] = each.map(|n| (n.to_string(), extra.clone())).collect();
        } else if let Some(pattern) = names["pattern"].as_str() {
            schema["patternProperties"] = json!({ pattern: extra });
        } else {
            schema["additionalProperties"] = extra;
            return;
        }
        schema["additionalProperties"] = json!({ "type": "null" });
    }
    for choice in schema
        .get_mut("oneOf")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        nullable_inside(choice);
    }
}

fn or_null(schema: Value) -> Value {
    json!({ "anyOf": [schema, { "type": "null" }] })
}
