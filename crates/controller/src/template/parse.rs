//! The template annotation's text → a pod template, strictly: an unknown or mistyped field is an
//! error naming it, not silently dropped.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::Value;

use super::errors::TemplateError;

/// Parses the drain template annotation's text strictly into a pod template.
///
/// The text is a JSON object with `metadata` and `spec`. It may also carry `kind: Pod` and
/// `apiVersion: v1` (so a pod manifest can be pasted); both are dropped, and any other kind or
/// API version is rejected. Fields a pod template does not have are errors naming the first one
/// found (k8s-openapi would silently ignore them); explicit `null`s are allowed anywhere.
pub fn parse_template(text: &str) -> Result<PodTemplateSpec, TemplateError> {
    let mut value: Value = serde_json::from_str(text).map_err(|e| TemplateError::NotJson {
        message: e.to_string(),
    })?;
    let object = value.as_object_mut().ok_or(TemplateError::NotAnObject)?;
    for (field, accepted) in [("kind", "Pod"), ("apiVersion", "v1")] {
        match object.remove(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(found)) if found == accepted => {}
            Some(Value::String(found)) => {
                return Err(TemplateError::NotAPodTemplate {
                    what: format!("{field} {found}"),
                });
            }
            Some(other) => {
                return Err(TemplateError::NotAPodTemplate {
                    what: format!("{field} {other}"),
                });
            }
        }
    }
    match object.get("spec") {
        None | Some(Value::Null) => return Err(TemplateError::NoSpec),
        Some(Value::Object(spec)) => match spec.get("containers") {
            None | Some(Value::Null) => return Err(TemplateError::NoContainers),
            Some(Value::Array(containers)) if containers.is_empty() => {
                return Err(TemplateError::NoContainers);
            }
            Some(_) => {}
        },
        // Not an object: the decoder says what is wrong with it.
        Some(_) => {}
    }
    let decode = |e: serde_json::Error| TemplateError::Decode {
        message: e.to_string(),
    };
    let template: PodTemplateSpec = serde_json::from_value(value.clone()).map_err(decode)?;
    let round_trip = serde_json::to_value(&template).map_err(decode)?;
    if let Some(path) = first_missing(&value, &round_trip, "") {
        return Err(TemplateError::UnknownField { path });
    }
    Ok(template)
}

/// The path of the first non-null value of `input` that `output` lacks, if any.
fn first_missing(input: &Value, output: &Value, path: &str) -> Option<String> {
    match input {
        Value::Object(fields) => fields.iter().find_map(|(key, value)| {
            let path = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            missing_here(value, output.get(key), path)
        }),
        Value::Array(items) => items.iter().enumerate().find_map(|(index, value)| {
            missing_here(value, output.get(index), format!("{path}[{index}]"))
        }),
        _ => None,
    }
}

fn missing_here(input: &Value, output: Option<&Value>, path: String) -> Option<String> {
    if input.is_null() {
        return None;
    }
    match output.filter(|o| !o.is_null()) {
        None => Some(path),
        Some(output) => first_missing(input, output, &path),
    }
}
