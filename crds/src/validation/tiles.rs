//! The CRD's rules on `spec.tileAllocation` in Rust, with the messages of its CEL (`crate::tile_allocation`).

use super::Checks;
use crate::tile_allocation::{
    MODEL_FORM, MODEL_NEEDS_DRA, SAME_RDU_NEEDS_DRA, TileAllocation, model_is_valid,
};

/// The CRD's rules on `spec.tileAllocation`, with its messages.
pub(super) fn check(c: &mut Checks, allocation: &TileAllocation) {
    let dra = allocation.is_dra();
    c.check(
        dra || !allocation.same_rdu,
        "spec.tileAllocation.sameRdu",
        || SAME_RDU_NEEDS_DRA.into(),
    );
    c.check(
        dra || allocation.model.is_none(),
        "spec.tileAllocation.model",
        || MODEL_NEEDS_DRA.into(),
    );
    if let Some(model) = &allocation.model {
        c.check(model_is_valid(model), "spec.tileAllocation.model", || {
            format!("{MODEL_FORM} (got {:?})", truncated(model))
        });
    }
}

/// At most the first 80 characters of `text`, for a message that quotes bad input.
fn truncated(text: &str) -> String {
    text.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TileApi;

    fn fields(allocation: &TileAllocation) -> Vec<String> {
        let mut c = Checks::default();
        check(&mut c, allocation);
        c.finish()
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    fn dra(same_rdu: bool, model: Option<&str>) -> TileAllocation {
        TileAllocation {
            api: TileApi::Dra,
            same_rdu,
            model: model.map(Into::into),
        }
    }

    #[test]
    fn the_default_is_valid() {
        assert_eq!(fields(&TileAllocation::default()), Vec::<String>::new());
    }

    #[test]
    fn placement_and_model_need_dra() {
        let cases = [
            (dra(true, Some("SN30")), vec![]),
            (dra(false, None), vec![]),
            (
                TileAllocation {
                    same_rdu: true,
                    ..Default::default()
                },
                vec!["spec.tileAllocation.sameRdu"],
            ),
            (
                TileAllocation {
                    model: Some("SN30".into()),
                    ..Default::default()
                },
                vec!["spec.tileAllocation.model"],
            ),
        ];
        for (allocation, expected) in cases {
            assert_eq!(fields(&allocation), expected, "{allocation:?}");
        }
    }

    #[test]
    fn a_model_is_a_plain_name_of_at_most_64_characters() {
        for good in ["SN30", "sn10-8r", "a", "A.b_c-9", &"x".repeat(64)] {
            assert!(model_is_valid(good), "{good:?}");
        }
        for bad in [
            "",
            "-SN30",
            ".x",
            "SN 30",
            "SN30\" || true || \"",
            "SN30'",
            "ü",
            &"x".repeat(65),
        ] {
            assert!(!model_is_valid(bad), "{bad:?}");
            assert_eq!(
                fields(&dra(false, Some(bad))),
                vec!["spec.tileAllocation.model"]
            );
        }
    }
}
