//! Decoding of the video instructions (`vadd`..`vset`, `vadd2`..`vset2`, `vadd4`..`vset4`): the
//! form comes from [`ptx::video::VideoForm`] (types, modifiers, selectors, negations), the
//! operands are the registers under the selectors.

use super::*;
use ptx::video::{base_operand, VideoForm};

impl Decoder<'_> {
    /// Decodes one video instruction into [`Op::Video`].
    pub(super) fn decode_video(
        &mut self,
        ins: &Instruction,
        ins0: &Instruction,
        guard: (u32, bool),
    ) -> Result<(), EmuError> {
        let form = VideoForm::from_instruction(ins).map_err(|e| self.err(ins, e))?;
        let kernel = self.f;
        let arg = |r: Role| role(kernel, ins, r);
        let d = self.dst(ins, base_operand(arg(Role::Dst)?))?;
        let a = self.src(ins, base_operand(arg(Role::A)?))?;
        let b = self.src(ins, base_operand(arg(Role::B)?))?;
        let c = match ins.operand(Role::C) {
            Some(o) => self.src(ins, base_operand(o))?,
            None => ZERO,
        };
        self.push(
            Op::Video {
                form: Box::new(form),
                d,
                a,
                b,
                c,
            },
            ins0,
            guard,
        );
        Ok(())
    }
}
